//! The `palisade` subcommands that talk to Redis: `worker`, `enqueue`, `status`, `dead`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::{bail, Context as _};
use palisade::store::redis::{ping, pool_with_ca, redacted};
use palisade::{
    Coordinator, Drain, FencedSink, FileEpochSource, LeaseStore, NewJob, PostgresEpochSource,
    RedisFencedStore, RedisLeaseStore, Scope, Sinks, Worker, WorkerConfig,
    DEFAULT_MAX_PAYLOAD_BYTES,
};
use serde_json::json;

use crate::LEDGER;

/// Where the coordinator lives.
#[derive(Clone, Debug, clap::Args)]
pub struct RedisArgs {
    /// Redis URL: redis://[user:password@]host[:port][/db]. The password never appears in
    /// logs or output.
    #[arg(long, env = "PALISADE_REDIS_URL", value_name = "URL")]
    pub redis: String,
    /// Key prefix of this Palisade installation (several can share one Redis).
    #[arg(long, env = "PALISADE_PREFIX", default_value = "palisade")]
    pub prefix: String,
    /// PEM certificate authority to trust for rediss:// URLs (default: the system's).
    #[arg(long, env = "PALISADE_REDIS_CA_FILE", value_name = "PATH")]
    pub redis_ca_file: Option<PathBuf>,
}

impl RedisArgs {
    fn pool(&self, url: &str) -> anyhow::Result<deadpool_redis::Pool> {
        Ok(pool_with_ca(url, self.redis_ca_file.as_deref())?)
    }

    async fn store(&self) -> anyhow::Result<(deadpool_redis::Pool, RedisLeaseStore)> {
        let pool = self.pool(&self.redis)?;
        ping(&pool)
            .await
            .with_context(|| format!("cannot reach Redis at {}", redacted(&self.redis)))?;
        let store = RedisLeaseStore::new(pool.clone(), &self.prefix);
        Ok((pool, store))
    }
}

/// `palisade worker`.
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Queues to claim from, comma-separated, claimed in turn.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    queues: Vec<String>,
    /// Handlers running at once (also the most jobs claimed per round trip).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Lease length; renewed every third of it. A paused worker loses its jobs after this.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Worker name shown in `palisade status` (default: host-pid).
    #[arg(long)]
    name: Option<String>,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Redis for the `ledger` fenced sink (default: the coordinator's Redis).
    #[arg(long, env = "PALISADE_SINK_REDIS_URL", value_name = "URL")]
    sink_redis: Option<String>,
    /// Durable epoch file (fsynced): recovery from Redis data loss without a refused write.
    /// Every worker of one prefix on this host must use the same file.
    #[arg(
        long,
        env = "PALISADE_EPOCH_FILE",
        value_name = "PATH",
        conflicts_with = "epoch_postgres"
    )]
    epoch_file: Option<PathBuf>,
    /// Durable epochs in a Postgres row (table palisade_epochs, named after --prefix): the
    /// same recovery for workers on many hosts.
    #[arg(long, env = "PALISADE_EPOCH_POSTGRES_URL", value_name = "URL")]
    epoch_postgres: Option<String>,
    /// On SIGTERM / SIGINT, how long running handlers get to finish; jobs still running
    /// then are released back to ready (no attempt counted, no stall charged).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    drain: Duration,
    /// Dead-lettered jobs kept per queue; the oldest go first (see `palisade dead purge`).
    #[arg(long, default_value_t = palisade::store::DEFAULT_DEAD_RETENTION, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=(1 << 40)))]
    dead_retention: usize,
}

/// Runs one worker process until SIGTERM / SIGINT, then drains.
pub fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.metrics {
        palisade::metrics::serve_prometheus(addr)
            .with_context(|| format!("serving /metrics on {addr}"))?;
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
    System::new().block_on(async move {
        let (pool, store) = args.redis.store().await?;
        let mut store = store.with_dead_retention(args.dead_retention);
        if let Some(path) = &args.epoch_file {
            store = store.with_epoch_source(Arc::new(FileEpochSource::new(path)));
        }
        if let Some(url) = &args.epoch_postgres {
            let source = PostgresEpochSource::connect(url, &args.redis.prefix)
                .await
                .context("connecting to the Postgres epoch source")?;
            store = store.with_epoch_source(Arc::new(source));
        }
        let sink_pool = match &args.sink_redis {
            Some(url) => {
                let sink_pool = args.redis.pool(url)?;
                ping(&sink_pool)
                    .await
                    .with_context(|| format!("cannot reach the sink's Redis at {}", redacted(url)))?;
                sink_pool
            }
            None => pool,
        };
        let coordinator = Coordinator::new(Arc::new(store))
            .with_reap_interval((args.lease / 4).min(Duration::from_secs(1)))
            .start();
        let ledger = RedisFencedStore::new(sink_pool, &format!("{}-sink", args.redis.prefix));
        let sinks = Sinks::new().with(LEDGER, FencedSink::new(LEDGER, Arc::new(ledger)).start());
        let config = WorkerConfig {
            queues: args.queues.clone(),
            concurrency: args.concurrency,
            batch: args.concurrency,
            lease_ttl: args.lease,
            poll_interval: Duration::from_millis(20),
            ..WorkerConfig::new(name.clone())
        };
        let worker = Worker::new(config, coordinator, crate::registry(), sinks)?.start();
        tracing::info!(worker = %name, redis = %redacted(&args.redis.redis), queues = ?args.queues, "worker started");

        let mut term = actix_rt::signal::unix::signal(actix_rt::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = actix_rt::signal::ctrl_c() => {}
        }
        tracing::info!(worker = %name, deadline = ?args.drain, "signal received; draining");
        let released = worker.send(Drain { deadline: args.drain }).await?;
        tracing::info!(worker = %name, released, "drained; exiting");
        anyhow::Ok(())
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into())
}

/// `palisade enqueue`.
#[derive(Clone, Debug, clap::Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Job kind, one of the kinds this binary handles (e.g. ledger.deposit).
    kind: String,
    /// Payload as JSON, checked against the kind's payload type before anything is sent.
    json: String,
    /// Protected scope (jobs sharing it run one at a time); default: the job's own `job:<id>`.
    #[arg(long)]
    scope: Option<String>,
    /// Queue.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Not claimable before this much time has passed, e.g. 30s or 5m.
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Higher runs first (-4096..=4096).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Handler failures allowed before the job is dead.
    #[arg(long, default_value_t = 5)]
    max_attempts: u32,
    /// Expired leases (stalls) allowed before the job is dead.
    #[arg(long, default_value_t = 3)]
    max_stalls: u32,
    /// Largest payload accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_PAYLOAD_BYTES)]
    max_payload_bytes: usize,
}

/// Enqueues one job and prints its id.
pub fn enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    crate::registry().check(&args.kind, &args.json)?;
    let mut job = NewJob::raw(&args.kind, &args.json)
        .with_queue(&args.queue)
        .with_priority(args.priority)
        .with_max_attempts(args.max_attempts)
        .with_max_stalls(args.max_stalls)
        .with_delay(args.delay.unwrap_or_default());
    if let Some(scope) = &args.scope {
        job = job.with_scope(scope.as_str());
    }
    job.validate(args.max_payload_bytes)?;
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let store = store.with_max_payload_bytes(args.max_payload_bytes);
        let ids = store.enqueue(vec![job]).await?;
        println!("{}", ids[0]);
        anyhow::Ok(())
    })
}

/// `palisade status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Also show the newest token granted for this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Most live leases to list.
    #[arg(long, default_value_t = 20)]
    leases: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Prints queue counts, live leases and, for `--scope`, the newest token.
pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let mut queues = Vec::new();
        for queue in store.queues().await? {
            let counts = store.counts(&queue).await?;
            queues.push((queue, counts));
        }
        let leases = store.leases(args.leases).await?;
        let highest = match &args.scope {
            Some(scope) => Some(store.highest_token(&Scope::new(scope.as_str())).await?),
            None => None,
        };
        if args.json {
            let out = json!({
                "queues": queues.iter().map(|(q, c)| (q.clone(), json!(c))).collect::<serde_json::Map<_, _>>(),
                "leases": leases.iter().map(|l| json!({
                    "lease": l.lease, "job": l.job, "scope": l.scope, "token": l.token,
                    "epoch": l.token.epoch(), "counter": l.token.counter(), "worker": l.worker,
                    "age_ms": l.age.as_millis() as u64, "expires_in_ms": l.expires_in.as_millis() as u64,
                })).collect::<Vec<_>>(),
                "scope": args.scope.as_ref().map(|s| json!({
                    "scope": s, "highest_token": highest.flatten(),
                })),
            });
            println!("{out}");
            return anyhow::Ok(());
        }
        println!("{:<20} {:>8} {:>8} {:>8} {:>8} {:>10} {:>6}", "queue", "ready", "waiting", "delayed", "leased", "completed", "dead");
        for (queue, c) in &queues {
            println!("{queue:<20} {:>8} {:>8} {:>8} {:>8} {:>10} {:>6}", c.ready, c.waiting, c.delayed, c.leased, c.completed, c.dead);
        }
        println!("\nlive leases ({}, soonest expiry first):", leases.len());
        for l in &leases {
            println!(
                "  {}  job {}  scope {}  token {}:{}  worker {}  age {:.1}s  expires in {:.1}s",
                l.lease, l.job, l.scope, l.token.epoch(), l.token.counter(), l.worker,
                l.age.as_secs_f64(), l.expires_in.as_secs_f64()
            );
        }
        if let (Some(scope), Some(highest)) = (&args.scope, highest) {
            match highest {
                Some(t) => println!("\nnewest token for {scope}: {}:{} (as stored by sinks: {t})", t.epoch(), t.counter()),
                None => println!("\nno token was ever granted for {scope}"),
            }
        }
        anyhow::Ok(())
    })
}

/// `palisade dead list|retry|purge`.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum DeadCommand {
    /// Print dead-lettered jobs with their reasons, one JSON object per line, oldest first.
    List(DeadArgs),
    /// Move dead-lettered jobs back to ready with fresh attempts, oldest first.
    Retry(DeadArgs),
    /// Delete dead-lettered jobs for good, oldest first (workers also keep at most
    /// `--dead-retention` per queue).
    Purge(DeadArgs),
}

/// Arguments of `palisade dead`.
#[derive(Clone, Debug, clap::Args)]
pub struct DeadArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Queue.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Most jobs to list or retry.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// Runs `palisade dead ...`.
pub fn dead(command: DeadCommand) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        match command {
            DeadCommand::List(args) => {
                let (_, store) = args.redis.store().await?;
                for dead in store.dead(&args.queue, args.limit).await? {
                    println!("{}", serde_json::to_string(&dead)?);
                }
            }
            DeadCommand::Retry(args) => {
                let (_, store) = args.redis.store().await?;
                let moved = store.retry_dead(&args.queue, args.limit).await?;
                println!("{moved} jobs moved back to {}", args.queue);
            }
            DeadCommand::Purge(args) => {
                let (_, store) = args.redis.store().await?;
                let purged = store.purge_dead(&args.queue, args.limit).await?;
                println!("{purged} dead jobs of {} deleted", args.queue);
            }
        }
        anyhow::Ok(())
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt)
}

/// Rejects flag combinations clap cannot express.
pub fn check_worker(args: &WorkerArgs) -> anyhow::Result<()> {
    if args.lease < Duration::from_millis(300) {
        bail!("--lease must be at least 300ms (it is renewed every third of it)");
    }
    Ok(())
}
