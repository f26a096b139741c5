//! Throughput harness: enqueue N no-op jobs, run W workers × C concurrency, report jobs/s,
//! claim→start latency, and — against Redis — client round trips, Redis commands and Redis
//! CPU per job (from `INFO commandstats` / `INFO cpu` deltas).
//!
//! Embedded:  `cargo run --release -p palisade-benches --bin throughput -- --jobs 200000`
//! Redis:     `cargo run --release -p palisade-benches --bin throughput -- --redis redis://127.0.0.1:6390 --jobs 20000 [--sink]`
//! Postgres:  `… --redis redis://127.0.0.1:6390 --jobs 20000 --postgres postgres://postgres@127.0.0.1/test`
//! Durable:   `… --sink --durable [--steps 10]` (each job a durable run of N steps; `--steps`
//!            alone: N plain fenced writes a job)
//! Cluster:   `… --cluster --redis redis://127.0.0.1:7000 --jobs 20000 [--sink]` (per-master
//!            CPU split; `benches/cluster.sh` starts a private 3-master cluster)
//! I/O-bound: `… --handler-ms 5 [--rate 4000]` (each handler awaits 5 ms; paced enqueue
//!            reports enqueue-to-start and end-to-end latency)
//!
//! Against Redis it uses a fresh key prefix and deletes its keys afterwards; run it against a
//! Redis nothing else uses, or the command and CPU counts include other clients' work.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use deadpool_redis::redis;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use palisade::*;

/// Throughput harness.
#[derive(clap::Parser)]
struct Args {
    /// Log as a worker with `--log-format json` at `RUST_LOG=warn` does (to nowhere): the
    /// attempt span kept for the lines it might log.
    #[arg(long)]
    log: bool,
    /// Export every span over OTLP/HTTP to this endpoint (a base URL; build with
    /// `--features otel`).
    #[cfg(feature = "otel")]
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
    /// No-op jobs to enqueue and run.
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Workers, each on its own arbiter thread.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Handlers per worker (also the claim batch size).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Run against this Redis instead of the embedded coordinator.
    #[arg(long)]
    redis: Option<String>,
    /// `--redis` names nodes of a Redis Cluster (comma-separated); the Redis figures are
    /// summed over its masters, and each master's share of the CPU is shown.
    #[arg(long, requires = "redis")]
    cluster: bool,
    /// Partitions of the Redis coordinator (each its own hash tag, epoch and counter).
    #[arg(long, default_value_t = 1)]
    partitions: usize,
    /// Each job makes one fenced write to a Redis sink (same Redis).
    #[arg(long)]
    sink: bool,
    /// With --sink: the write is a durable run's one step (`ctx.durable("bench")?.step(..)`),
    /// its journal entry in the same fenced write.
    #[arg(long, requires = "sink")]
    durable: bool,
    /// With --sink: each job makes this many fenced writes (with --durable: steps), one after
    /// another.
    #[arg(long, default_value_t = 1, requires = "sink")]
    steps: usize,
    /// Each job runs one fenced transaction on a Postgres sink at this URL (a fresh schema,
    /// dropped afterwards) that updates one row of a 1,000-row table.
    #[arg(long, value_name = "URL", conflicts_with = "sink")]
    postgres: Option<String>,
    /// Spread jobs over this many shared scopes (e.g. accounts) instead of one scope per job.
    #[arg(long)]
    scopes: Option<usize>,
    /// Simulate a paused worker holding this many hot scopes: each hot scope's first job is
    /// claimed under a lease nobody renews or settles, and 100 more jobs per hot scope are
    /// queued *ahead* of the measured jobs (higher priority). Measures how fast free scopes
    /// flow past held ones.
    #[arg(long, default_value_t = 0)]
    pause_holder: usize,
    /// CPU-bound handlers: each job spins this many microseconds on its worker's arbiter
    /// thread (compare `--workers 1` and `--workers 2`: one arbiter is one core).
    #[arg(long, default_value_t = 0)]
    cpu_us: u64,
    /// I/O-bound handlers: each job awaits this many milliseconds on average (a call to an API
    /// or a database), holding its slot but no thread: uniformly between half and one and a
    /// half times it, woken at that instant by a timer thread of the harness's own (tokio's
    /// timer wakes on millisecond ticks, which would finish handlers in lockstep, as real
    /// replies do not).
    #[arg(long, default_value_t = 0)]
    handler_ms: u64,
    /// Enqueue at this many jobs a second while the workers run (every millisecond, the jobs
    /// due by then) instead of all before, and report enqueue-to-start and end-to-end latency.
    /// Keep it below the workers' capacity (concurrency / handler time), or the latency is the
    /// backlog's.
    #[arg(long)]
    rate: Option<u64>,
    /// The workers' settlement and claim linger in microseconds (default: the library's,
    /// `WorkerConfig::DEFAULT_LINGER`; 0 sends every settlement and claim at once).
    #[arg(long)]
    linger_us: Option<u64>,
    /// Idempotency-key retention of the Redis sink (the library's default: 24 h).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    key_retention: Duration,
    /// After the run, wait out the key retention, let the sink collect, and report the
    /// Redis bytes left per job (use with a short --key-retention, e.g. 2s).
    #[arg(long)]
    measure_memory: bool,
    /// A shell command run at each phase's start and end (before the enqueue, between it and
    /// the run, after the run): `callgrind_control -d` dumps a redis-server run under
    /// callgrind once per phase, so its instructions are counted per phase
    /// (`benches/callgrind.sh`).
    #[arg(long, value_name = "COMMAND")]
    phase_hook: Option<String>,
    /// Completed jobs' records the Redis coordinator keeps (the library's default: 10,000, a
    /// day); 0 keeps none, as before issue 57 (compare the two to see what keeping costs).
    #[arg(long, default_value_t = 10_000)]
    keep_completed: usize,
}

/// Runs `--phase-hook`, if any, and waits for it.
fn phase_hook(args: &Args) {
    if let Some(command) = &args.phase_hook {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "--phase-hook {command:?} failed: {status:?}"
        );
    }
}

/// A Redis's cumulative counters, for deltas.
#[derive(Default)]
struct RedisStats {
    commands: BTreeMap<String, u64>,
    cpu_seconds: f64,
    /// The kernel's part of `cpu_seconds` (`used_cpu_sys`): the system calls that read and
    /// answer clients, which grow with round trips, not with the work of a call.
    cpu_sys_seconds: f64,
    /// The CPU of the thread that runs commands and scripts (`used_cpu_*_main_thread`,
    /// Redis 6.2 on; 0 before): the one that bounds a run, where `cpu_seconds` also counts
    /// background and I/O threads.
    cpu_main_seconds: f64,
    used_memory: i64,
    /// Bytes the server read from and wrote to its clients.
    net_bytes: u64,
}

/// Every server that does the work: the one Redis, or each master of a cluster (by address).
async fn servers(args: &Args) -> Vec<(String, deadpool_redis::Pool)> {
    let url = args.redis.as_deref().unwrap();
    if !args.cluster {
        return vec![(url.to_owned(), store::redis::pool(url).expect("redis url"))];
    }
    let seed = url.split(',').next().unwrap();
    let mut conn = store::redis::pool(seed)
        .expect("redis url")
        .get()
        .await
        .expect("seed reachable");
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .unwrap();
    nodes
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|flags| flags.contains("master") && !flags.contains("fail"))
        })
        .map(|l| {
            let address = l.split_whitespace().nth(1).unwrap();
            let address = address.split('@').next().unwrap().to_owned();
            let pool = store::redis::pool(&format!("redis://{address}")).unwrap();
            (address, pool)
        })
        .collect()
}

/// The counters of every server, summed, and each one's CPU seconds.
async fn all_stats(servers: &[(String, deadpool_redis::Pool)]) -> (RedisStats, Vec<f64>) {
    let mut total = RedisStats::default();
    let mut cpu = Vec::new();
    for (_, pool) in servers {
        let one = redis_stats(pool).await;
        for (name, calls) in one.commands {
            *total.commands.entry(name).or_default() += calls;
        }
        total.cpu_seconds += one.cpu_seconds;
        total.cpu_sys_seconds += one.cpu_sys_seconds;
        total.cpu_main_seconds += one.cpu_main_seconds;
        total.used_memory += one.used_memory;
        total.net_bytes += one.net_bytes;
        cpu.push(one.cpu_seconds);
    }
    (total, cpu)
}

async fn redis_stats(pool: &deadpool_redis::Pool) -> RedisStats {
    let mut conn = pool.get().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut stats = RedisStats::default();
    for line in info.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (name, fields) = rest.split_once(':').unwrap();
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            stats.commands.insert(name.to_owned(), calls);
        }
        for key in ["total_net_input_bytes:", "total_net_output_bytes:"] {
            if let Some(v) = line.strip_prefix(key) {
                stats.net_bytes += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
        if let Some(v) = line.strip_prefix("used_memory:") {
            stats.used_memory = v.trim().parse().unwrap_or(0);
        }
        let seconds = |v: &str| v.trim().parse::<f64>().unwrap_or(0.0);
        match line.split_once(':') {
            Some(("used_cpu_user", v)) => stats.cpu_seconds += seconds(v),
            Some(("used_cpu_sys", v)) => {
                stats.cpu_seconds += seconds(v);
                stats.cpu_sys_seconds += seconds(v);
            }
            Some(("used_cpu_user_main_thread" | "used_cpu_sys_main_thread", v)) => {
                stats.cpu_main_seconds += seconds(v)
            }
            _ => {}
        }
    }
    stats
}

impl RedisStats {
    /// Commands run since `before`, excluding the INFO calls that measure them.
    fn commands_since(&self, before: &RedisStats) -> u64 {
        self.commands
            .iter()
            .filter(|(name, _)| *name != "info")
            .map(|(name, calls)| calls - before.commands.get(name).copied().unwrap_or(0))
            .sum()
    }
}

/// Wakes waiters at their deadlines, each at its own instant, from a thread of its own.
#[derive(Clone)]
struct Alarm(std::sync::mpsc::Sender<(Instant, tokio::sync::oneshot::Sender<()>)>);

impl Alarm {
    fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<(Instant, tokio::sync::oneshot::Sender<()>)>();
        std::thread::spawn(move || {
            let mut due: BTreeMap<(Instant, u64), tokio::sync::oneshot::Sender<()>> =
                BTreeMap::new();
            let mut seq = 0u64;
            loop {
                let next = due.keys().next().map(|k| k.0);
                let got = match next {
                    Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                    None => rx
                        .recv()
                        .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
                };
                match got {
                    Ok((at, waker)) => {
                        seq += 1;
                        due.insert((at, seq), waker);
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                }
                let now = Instant::now();
                while let Some(entry) = due.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let _ = entry.remove().send(());
                }
            }
        });
        Self(tx)
    }

    async fn wait(&self, d: Duration) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.0.send((Instant::now() + d, tx));
        let _ = rx.await;
    }
}

/// CPU seconds used so far by every process named `postgres` on this machine (the server's
/// backends, checkpointer, WAL writer …, and those that exited): the harness runs beside the
/// database it measures.
fn postgres_cpu_seconds() -> f64 {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if !stat
            .rsplit_once(')')
            .is_some_and(|(head, _)| head.ends_with("(postgres"))
        {
            continue;
        }
        // With the reaped children's time: backends that exited count in the postmaster's.
        total += stat_cpu_seconds(&stat, 4);
    }
    total
}

/// CPU seconds (user and system) this process has used so far: its workers, the coordinator
/// (embedded) or its client (Redis), and the harness itself.
fn own_cpu_seconds() -> f64 {
    stat_cpu_seconds(
        &std::fs::read_to_string("/proc/self/stat").unwrap_or_default(),
        2,
    )
}

/// The sum of the first `n` of utime, stime, cutime, cstime of a `/proc/<pid>/stat` line.
fn stat_cpu_seconds(stat: &str, n: usize) -> f64 {
    // "pid (comm) state ..." — utime is field 14, the 12th after the command's ')'; in
    // ticks of USER_HZ, 100 on Linux.
    let ticks = 100.0;
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    rest.split_whitespace()
        .skip(11)
        .take(n)
        .map(|field| field.parse::<f64>().unwrap_or(0.0) / ticks)
        .sum()
}

/// The server's next transaction id: every writing transaction (committed or rolled back)
/// takes one, so the difference counts them (the server's statistics lag by up to 10 s).
async fn postgres_xid(pg: &PostgresSink) -> i64 {
    let client = pg.pool().get().await.unwrap();
    client
        .query_one("SELECT txid_current()", &[])
        .await
        .unwrap()
        .get(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A quantile of a summary the recorder renders (no buckets configured), summed over labels.
fn summary_quantile(text: &str, name: &str, quantile: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("quantile=\"{quantile}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

fn round_trips(metrics: &PrometheusHandle, ops: &[&str]) -> u64 {
    let text = metrics.render();
    ops.iter()
        .map(|op| {
            palisade::metrics::sample_sum(
                &text,
                palisade::metrics::REDIS_ROUND_TRIPS,
                &[("op", op)],
            )
        })
        .sum()
}

// As the `palisade` binary; `--features system-alloc` measures with glibc malloc instead
// (docs/performance.md).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The subscriber `--log` and `--otlp` ask for; the exporter sends what is left when dropped.
fn tracing_for(args: &Args) -> Option<Box<dyn std::any::Any>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let log = args.log.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::sink)
            .with_filter(tracing_subscriber::EnvFilter::new(
                "warn,palisade::job=info",
            ))
    });
    #[cfg(feature = "otel")]
    {
        let export = args.otlp.as_deref().map(|url| {
            palisade::otel::Export::from_env(Some(url))
                .expect("OTLP settings")
                .expect("an endpoint")
        });
        let otel = export.as_ref().map(|e| {
            e.layer()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
        });
        if log.is_some() || otel.is_some() {
            tracing_subscriber::registry().with(log).with(otel).init();
        }
        // `return`: a cfg'd block before another is a statement, so it cannot be the tail.
        #[allow(clippy::needless_return)]
        return export.map(|e| Box::new(e) as Box<dyn std::any::Any>);
    }
    #[cfg(not(feature = "otel"))]
    {
        if log.is_some() {
            tracing_subscriber::registry().with(log).init();
        }
        None
    }
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let _export = tracing_for(&args);
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .expect("recorder");
    let system = System::new();
    system.block_on(async move {
        let prefix = format!("bench-{}", uuid::Uuid::new_v4());
        let (store, target): (palisade::Stores, Option<store::redis::Target>) = match &args.redis {
            Some(url) => {
                let target: store::redis::Target = if args.cluster {
                    let nodes: Vec<&str> = url.split(',').collect();
                    store::redis::cluster(&nodes).expect("cluster urls").into()
                } else {
                    store::redis::pool(url).expect("redis url").into()
                };
                store::redis::ping(&target).await.expect("redis reachable");
                let keep = if args.keep_completed == 0 {
                    palisade::CompletedRetention::off()
                } else {
                    palisade::CompletedRetention {
                        max: args.keep_completed,
                        ..Default::default()
                    }
                };
                let store = store::redis::coordinator(target.clone(), &prefix, args.partitions, 0, palisade::DEFAULT_MAX_PAYLOAD_BYTES, |s| s.with_completed_retention(keep))
                    .expect("partitions");
                (store, Some(target))
            }
            None => (Arc::new(MemoryLeaseStore::new()).into(), None),
        };
        let servers = match &args.redis {
            Some(_) => servers(&args).await,
            None => Vec::new(),
        };
        let pool = servers.first().map(|(_, pool)| pool.clone()).filter(|_| !args.cluster);
        let mut redis_sink = None;
        let sinks = match (&target, args.sink) {
            (Some(target), true) => {
                let sink = RedisFencedStore::new(target.clone(), &format!("{prefix}-sink"))
                    .with_key_retention(args.key_retention, 10_000);
                redis_sink = Some(sink.clone());
                Sinks::new().with("bench", FencedSink::new("bench", Arc::new(sink)).start())
            }
            (None, true) => {
                let sink = MemoryFencedStore::new();
                Sinks::new().with("bench", FencedSink::new("bench", Arc::new(sink)).start())
            }
            _ => Sinks::new(),
        };
        let bench_schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
        let postgres_sink = match &args.postgres {
            Some(url) => {
                let sep = if url.contains('?') { '&' } else { '?' };
                let sink = PostgresSink::connect(&format!("{url}{sep}schema={bench_schema}"))
                    .await
                    .expect("postgres reachable");
                sink.pool()
                    .get()
                    .await
                    .unwrap()
                    .batch_execute(&format!(
                        "CREATE TABLE {bench_schema}.account (id bigint PRIMARY KEY, n bigint NOT NULL);
                         INSERT INTO {bench_schema}.account SELECT i, 0 FROM generate_series(0, 999) i;"
                    ))
                    .await
                    .unwrap();
                Some(Arc::new(sink))
            }
            None => None,
        };
        let sinks = match &postgres_sink {
            Some(pg) => sinks.with_postgres("pg", pg.clone()),
            None => sinks,
        };
        if args.pause_holder > 0 {
            let hot: Vec<NewJob> = (0..args.pause_holder)
                .flat_map(|h| (0..101).map(move |_| NewJob::raw("noop", "null").with_scope(format!("hot:{h}")).with_priority(10)))
                .collect();
            for chunk in hot.chunks(1000) {
                store.enqueue(chunk.to_vec()).await.unwrap();
            }
            let held = store.claim("default", "paused", args.pause_holder, Duration::from_secs(3600)).await.unwrap();
            assert_eq!(held.len(), args.pause_holder, "the paused holder got every hot scope");
        }
        let coordinator = Coordinator::new(store.clone()).start();
        let mut pg_before = None;

        if let Some(pg) = &postgres_sink {
            pg_before = Some((postgres_cpu_seconds(), postgres_xid(pg).await));
        }
        let (before, _) = all_stats(&servers).await;
        phase_hook(&args);
        let t0 = Instant::now();
        // With --rate, a job's payload is its number, so its handler finds its enqueue time.
        let job = move |i: usize| {
            let payload = if args.rate.is_some() { i.to_string() } else { "null".into() };
            match args.scopes {
                Some(scopes) => NewJob::raw("noop", payload).with_scope(format!("acct:{}", i % scopes.max(1))),
                None => NewJob::raw("noop", payload),
            }
        };
        let enqueued_at: Arc<Vec<Mutex<Option<Instant>>>> = Arc::new((0..args.jobs).map(|_| Mutex::new(None)).collect());
        if args.rate.is_none() {
            let jobs: Vec<NewJob> = (0..args.jobs).map(job).collect();
            for chunk in jobs.chunks(1000) {
                coordinator.send(Enqueue(chunk.to_vec())).await.unwrap().unwrap();
            }
        }
        let enqueue = t0.elapsed();
        let enqueue_trips = round_trips(&metrics, &["enqueue"]);
        let (after_enqueue, cpu_after_enqueue) = all_stats(&servers).await;
        phase_hook(&args);

        let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.jobs)));
        let alarm = Alarm::start();
        // (enqueue → handler start, enqueue → handler end) of each job, with --rate.
        let spans = Arc::new(Mutex::new(Vec::with_capacity(args.jobs)));
        // Handlers that reached their end: the run's end is watched here, in the process, and
        // the coordinator asked only once they all have, not every 2 ms all along (on Redis a
        // counts script each time, billed to the jobs: within noise in time, but under
        // callgrind, whose server runs ~50 times slower, those calls outnumbered the jobs').
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ttl = Duration::from_secs(30);
        let t1 = Instant::now();
        let own_before = own_cpu_seconds();
        let mut arbiters = Vec::new();
        for i in 0..args.workers {
            let config = WorkerConfig {
                concurrency: args.concurrency,
                batch: args.concurrency,
                lease_ttl: ttl,
                poll_interval: Duration::from_millis(1),
                linger: args.linger_us.map_or(WorkerConfig::DEFAULT_LINGER, Duration::from_micros),
                ..WorkerConfig::new(format!("bench-{i}"))
            };
            let (latencies, write, cpu, cluster) = (latencies.clone(), args.sink, Duration::from_micros(args.cpu_us), args.cluster);
            let (durable, steps) = (args.durable, args.steps);
            let (spans, enqueued_at, wait, alarm, ended) = (spans.clone(), enqueued_at.clone(), Duration::from_millis(args.handler_ms), alarm.clone(), ended.clone());
            let update = args.postgres.is_some().then(|| format!("UPDATE {bench_schema}.account SET n = n + 1 WHERE id = $1"));
            let registry = Registry::new().register("noop", move |ctx: JobContext, number: Option<usize>| {
                let (latencies, update, spans, enqueued_at, alarm, ended) = (latencies.clone(), update.clone(), spans.clone(), enqueued_at.clone(), alarm.clone(), ended.clone());
                async move {
                    let started = Instant::now();
                    // The lease deadline is claim-request time + ttl.
                    let claimed = ctx.lease().expires_at - ttl;
                    latencies.lock().unwrap().push(claimed.elapsed());
                    let spin = Instant::now();
                    while spin.elapsed() < cpu {
                        std::hint::spin_loop();
                    }
                    if !wait.is_zero() {
                        // Uniform in [wait / 2, 3 wait / 2], from the job id's random bits.
                        let spread = (ctx.job().id.as_uuid().as_u128() % 1000) as u32;
                        alarm.wait(wait / 2 + wait * spread / 1000).await;
                    }
                    if write {
                        // One shared data key: what is measured afterwards is the sink's own state, not
                        // the data the jobs wrote. On a cluster the key must share the scope's slot.
                        let key = if cluster { format!("{{{}}}n", ctx.job().scope) } else { "n".into() };
                        let incr = Mutation::HashIncr { key, field: "n".into(), by: 1 };
                        if durable {
                            let run = ctx.durable("bench")?;
                            for step in 0..steps {
                                let incr = incr.clone();
                                run.step(&step.to_string(), || async { Ok((vec![incr], ())) }).await?;
                            }
                        } else {
                            let sink = ctx.sink("bench")?;
                            for _ in 0..steps {
                                sink.write(vec![incr.clone()]).await?.accepted()?;
                            }
                        }
                    }
                    if let Some(update) = update {
                        let row = (ctx.job().id.as_uuid().as_u128() % 1000) as i64;
                        ctx.postgres("pg")?
                            .transaction("w", move |tx| {
                                Box::pin(async move {
                                    tx.execute(&update, &[&row]).await?;
                                    Ok(())
                                })
                            })
                            .await?
                            .accepted()?;
                    }
                    let enqueued = number.and_then(|i| *enqueued_at.get(i)?.lock().unwrap());
                    if let Some(enqueued) = enqueued {
                        spans.lock().unwrap().push((started - enqueued, enqueued.elapsed()));
                    }
                    ended.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(())
                }
            });
            let worker = Worker::new(config, coordinator.clone(), registry, sinks.clone()).unwrap();
            let arbiter = Arbiter::new();
            Worker::start_in_arbiter(&arbiter.handle(), move |_| worker);
            arbiters.push(arbiter);
        }
        if let Some(rate) = args.rate {
            // Paced: every millisecond, the jobs due by then, each stamped as it is sent.
            let mut sent = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while sent < args.jobs {
                tick.tick().await;
                let due = ((t1.elapsed().as_secs_f64() * rate as f64) as usize).min(args.jobs);
                if due > sent {
                    let now = Instant::now();
                    for slot in &enqueued_at[sent..due] {
                        *slot.lock().unwrap() = Some(now);
                    }
                    coordinator.send(Enqueue((sent..due).map(job).collect())).await.unwrap().unwrap();
                    sent = due;
                }
            }
        }
        // (A handler that failed and runs again counts twice: the coordinator has the last word.)
        while ended.load(std::sync::atomic::Ordering::Relaxed) < args.jobs {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        loop {
            let counts = coordinator.send(CountJobs("default".into())).await.unwrap().unwrap();
            // (The hot scopes' jobs never complete: their holder is paused for the whole run.)
            // (A durable run's completion sets a job going that clears its journal.)
            let jobs = if args.durable { 2 * args.jobs } else { args.jobs };
            if counts.completed as usize >= jobs {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let run = t1.elapsed();
        let own_cpu = own_cpu_seconds() - own_before;
        let n = args.jobs as f64;
        // CPU per job of every process measured (µs): this one, then Redis and Postgres.
        let mut cpu_per_job = vec![("this process", own_cpu / n * 1e6)];
        let mut lat = latencies.lock().unwrap().clone();
        lat.sort();
        let mode = match (&args.redis, args.sink, args.postgres.is_some()) {
            _ if args.durable && args.redis.is_some() => "redis + a durable step (its fenced redis sink write with the journal entry)",
            _ if args.durable => "embedded + a durable step (its fenced memory sink write with the journal entry)",
            (Some(_), _, true) => "redis + fenced postgres transaction (one row update)",
            (None, _, true) => "embedded + fenced postgres transaction (one row update)",
            (Some(_), true, _) => "redis + fenced redis sink write",
            (Some(_), false, _) => "redis",
            (None, true, _) => "embedded + fenced memory sink write",
            (None, false, _) => "embedded",
        };
        let mut scopes = args.scopes.map_or("one scope per job".to_string(), |n| format!("{n} shared scopes"));
        if args.pause_holder > 0 {
            scopes += &format!(", a paused holder of {} hot scopes with {} jobs queued ahead", args.pause_holder, args.pause_holder * 100);
        }
        let partitions = if args.partitions > 1 { format!(", {} partitions", args.partitions) } else { String::new() };
        println!(
            "{mode}: {} no-op jobs, {} worker(s) x {} concurrency, {scopes}{partitions}",
            args.jobs, args.workers, args.concurrency
        );
        println!("  enqueue      {:>9.0} jobs/s (bulk, 1000 per call)", n / enqueue.as_secs_f64());
        println!("  run          {:>9.0} jobs/s ({:.2}s)", n / run.as_secs_f64(), run.as_secs_f64());
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("  claim->start p50 {:.2}ms  p99 {:.2}ms", ms(percentile(&lat, 0.5)), ms(percentile(&lat, 0.99)));
        println!("  this process's CPU per job (workers, coordinator or its client, harness): run {:.1}µs", own_cpu / n * 1e6);
        if let Some(rate) = args.rate {
            let spans = spans.lock().unwrap();
            let mut to_start: Vec<Duration> = spans.iter().map(|s| s.0).collect();
            let mut to_end: Vec<Duration> = spans.iter().map(|s| s.1).collect();
            to_start.sort();
            to_end.sort();
            let text = metrics.render();
            let wait = |q: &str| summary_quantile(&text, palisade::metrics::SETTLE_WAIT, q) * 1e3;
            println!("  paced at {rate} jobs/s, {} handler ms:", args.handler_ms);
            println!("  enqueue->start       p50 {:.2}ms  p99 {:.2}ms", ms(percentile(&to_start, 0.5)), ms(percentile(&to_start, 0.99)));
            println!("  enqueue->handler end p50 {:.2}ms  p99 {:.2}ms", ms(percentile(&to_end, 0.5)), ms(percentile(&to_end, 0.99)));
            println!("  settle wait (handler end->settled) p50 {:.2}ms  p99 {:.2}ms", wait("0.5"), wait("0.99"));
        }
        if !servers.is_empty() {
            let (after, cpu_after) = all_stats(&servers).await;
            phase_hook(&args);
            let run_trips = round_trips(&metrics, &["claim", "settle", "settle_and_claim", "renew", "reap", "establish_epoch"]);
            let sink_trips = round_trips(&metrics, &["fenced_write"]);
            let by_op: Vec<String> = ["claim", "settle", "settle_and_claim", "renew"]
                .iter()
                .map(|op| format!("{op} {:.3}", round_trips(&metrics, &[op]) as f64 / n))
                .collect();
            println!("  round trips per job by op: {}", by_op.join(", "));
            println!(
                "  round trips per job: claim+complete {:.3}, with sink {:.3}, enqueue {:.4}",
                run_trips as f64 / n,
                (run_trips + sink_trips) as f64 / n,
                enqueue_trips as f64 / n
            );
            println!(
                "  Redis commands per job (scripts' inner commands included): enqueue {:.1}, run {:.1}, total {:.1}",
                after_enqueue.commands_since(&before) as f64 / n,
                after.commands_since(&after_enqueue) as f64 / n,
                after.commands_since(&before) as f64 / n
            );
            println!(
                "  Redis CPU per job: run {:.1}µs, enqueue {:.1}µs",
                (after.cpu_seconds - after_enqueue.cpu_seconds) / n * 1e6,
                (after_enqueue.cpu_seconds - before.cpu_seconds) / n * 1e6
            );
            println!(
                "  Redis kernel CPU per job (of the above): run {:.1}µs",
                (after.cpu_sys_seconds - after_enqueue.cpu_sys_seconds) / n * 1e6
            );
            cpu_per_job.push(("Redis", (after.cpu_seconds - after_enqueue.cpu_seconds) / n * 1e6));
            // A tighter bound where one Redis does the work: it runs every command and script
            // on one thread, whatever the cores, so that thread's CPU per job alone caps a run
            // of jobs enqueued beforehand (a cluster spreads it; paced runs enqueue meanwhile,
            // on the same thread). Redis before 6.2 does not report the thread apart.
            let main_us = (after.cpu_main_seconds - after_enqueue.cpu_main_seconds) / n * 1e6;
            if !args.cluster && args.rate.is_none() && main_us > 0.0 {
                println!(
                    "  Redis's command thread alone, for jobs enqueued beforehand: at most {:.0} jobs/s at its {main_us:.1}µs per job; this run kept it {:.0} % busy",
                    1e6 / main_us,
                    n / run.as_secs_f64() * main_us / 1e6 * 100.0
                );
            }
            // Work counted rather than timed (time is shared by every process on the cores).
            println!(
                "  Redis network bytes per job (in + out, every server): run {:.0}",
                (after.net_bytes - after_enqueue.net_bytes) as f64 / n
            );
            if args.cluster {
                let run_cpu = after.cpu_seconds - after_enqueue.cpu_seconds;
                let split: Vec<String> = servers
                    .iter()
                    .zip(cpu_after.iter().zip(&cpu_after_enqueue))
                    .map(|((address, _), (a, b))| format!("{address} {:.0}%", (a - b) / run_cpu * 100.0))
                    .collect();
                println!("  Redis CPU of the run per master: {}", split.join(", "));
            }
            // Memory model: bytes left per finished job, right after the run and — with a
            // sink — once the key retention has passed and the sink has collected.
            let left = |s: &RedisStats| (s.used_memory - before.used_memory) as f64 / n;
            println!(
                "  Redis memory per queued job: {:.0} B; left per finished job: {:.0} B right after the run",
                left(&after_enqueue),
                left(&after)
            );
            if let (true, Some(sink), Some(w), Some(pool)) = (args.measure_memory, &redis_sink, store.watermark(), &pool) {
                tokio::time::sleep(args.key_retention + Duration::from_millis(200)).await;
                sink.observe_watermark(w);
                let probe = Scope::new(format!("probe:{prefix}"));
                for i in 0..(args.jobs / 400 + 2) {
                    let nudge: Vec<FencedWrite> = (0..200)
                        .map(|k| FencedWrite {
                            scope: probe.clone(),
                            fence: Fence { token: w, lease: LeaseId::from(uuid::Uuid::nil()) },
                            key: IdempotencyKey::new(format!("{i}/{k}")),
                            mutations: vec![],
                        })
                        .collect();
                    sink.write_batch(nudge).await.unwrap();
                }
                let mut conn = pool.get().await.unwrap();
                let mut expired = 0u64;
                // Expired keys are reclaimed lazily by Redis; touch what is left so the
                // measurement shows what the store keeps, not Redis' expiry backlog.
                let mut cursor = 0u64;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN").arg(cursor).arg("COUNT").arg(1000).query_async(&mut conn).await.unwrap();
                    for key in keys {
                        let exists: u64 = redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await.unwrap();
                        expired += 1 - exists;
                    }
                    cursor = next;
                    if cursor == 0 {
                        break;
                    }
                }
                let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
                drop(conn);
                println!("  Redis keys left: {size} (expired keys reclaimed by the scan: {expired})");
                let collected = redis_stats(pool).await;
                println!(
                    "  Redis memory left per finished job: {:.0} B after the {:?} key retention and collection",
                    left(&collected),
                    args.key_retention
                );
            }
            for (_, pool) in &servers {
                let mut conn = pool.get().await.unwrap();
                for pattern in [format!("{{{prefix}*"), format!("{prefix}-sink:*")] {
                    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(&mut conn).await.unwrap();
                    // One key at a time: on a cluster the keys of one node span slots.
                    for key in keys {
                        let _: () = redis::cmd("DEL").arg(key).query_async(&mut conn).await.unwrap();
                    }
                }
            }
        }
        if let (Some(pg), Some((cpu, commits))) = (&postgres_sink, pg_before) {
            let cpu = postgres_cpu_seconds() - cpu;
            // Less the one txid_current() itself takes.
            let commits = postgres_xid(pg).await - commits - 1;
            println!(
                "  Postgres CPU per job {:.1}µs (every postgres process on this machine), writing transactions per job {:.3}",
                cpu / n * 1e6,
                commits as f64 / n
            );
            cpu_per_job.push(("Postgres", cpu / n * 1e6));
            let client = pg.pool().get().await.unwrap();
            let total: i64 = client
                .query_one(&format!("SELECT sum(n)::bigint FROM {bench_schema}.account"), &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(total as usize, args.jobs, "every job's row update applied exactly once");
            client.batch_execute(&format!("DROP SCHEMA {bench_schema} CASCADE")).await.unwrap();
        }
        // A bound on jobs/s from work, not time: the processes share this machine's cores, so
        // a run cannot go faster than the cores divided by their CPU per job.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let total: f64 = cpu_per_job.iter().map(|(_, us)| us).sum();
        let parts: Vec<String> = cpu_per_job.iter().map(|(who, us)| format!("{who} {us:.1}")).collect();
        println!(
            "  CPU per job of the processes measured: {} = {total:.1}µs: at most {:.0} jobs/s on {cores} cores",
            parts.join(" + "),
            cores as f64 / total * 1e6
        );
        for a in arbiters {
            a.stop();
        }
        System::current().stop();
    });
}
