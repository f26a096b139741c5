//! `worker`: N [`Worker`]s on N arbiter threads against one Redis coordinator, with the
//! named fenced sinks, the `/metrics` `/healthz` `/readyz` listener, and a drain on SIGTERM.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::{bail, Context as _};
use palisade::store::redis::Target;

use super::relay::RelayArgs;
use super::sinks::{is_postgres, postgres_sinks, sink_urls};
use super::{RedisArgs, STARTUP_PATIENCE};
use palisade::metrics::Health;
use palisade::store::epoch::{FileEpochSource, PostgresEpochSource};
use palisade::store::postgres::Migrations;
use palisade::store::postgres::{PostgresFencedStore, PostgresSink};
use palisade::store::redis::{ping, redacted};
use palisade::store::{ControlStore, DEFAULT_DEAD_RETENTION, MAX_DEAD_RETENTION};
use palisade::Coordinator;
use palisade::FencedSink;
use palisade::RedisFencedStore;
use palisade::{Drain, Worker, WorkerConfig};
use palisade::{Registry, Sinks};

/// `worker`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct WorkerArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Queues to claim from, comma-separated, each with an optional weight: `critical:3,default`
    /// claims from `critical` three times for every claim from `default` (weighted round
    /// robin, as in Sidekiq). A queue with nothing ready costs one empty claim in its turn.
    #[arg(long, value_delimiter = ',', default_value = "default", value_parser = parse_queue)]
    queues: Vec<(String, u32)>,
    /// Handlers running at once on each arbiter (also the most jobs claimed per round trip),
    /// 1..=10000.
    #[arg(long, default_value_t = 32, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    concurrency: usize,
    /// Worker arbiters (threads) in this process, each running its own `Worker` with its own
    /// renewals; default: one per core.
    #[arg(long)]
    arbiters: Option<usize>,
    /// Lease length (300ms..=24h); renewed every third of it. A paused worker loses its jobs
    /// after this.
    #[arg(long, default_value = "30s", value_parser = super::duration_within(Duration::from_millis(300), super::DAY))]
    lease: Duration,
    /// How long a finished job's settlement, and a freed slot's claim, may wait for others to
    /// share a round trip (0..=1s; `0ms`: each at once). At most a tenth of `--lease`.
    #[arg(long, default_value = "2ms", value_parser = super::duration_within(Duration::ZERO, Duration::from_secs(1)))]
    linger: Duration,
    /// Worker name shown in `status` (default: host-pid; `/N` is appended per arbiter).
    #[arg(long)]
    name: Option<String>,
    /// First retry's delay ceiling: a failed attempt waits a random time in the upper half of
    /// `base * 2^(attempt-1)`, capped by `--retry-max`. Kinds the binary gave their own policy
    /// keep it. With the defaults a job's 20 attempts span 16.5 to 33 hours.
    #[arg(long, default_value = "1s", value_parser = super::duration_within(Duration::from_millis(1), super::DAY))]
    retry_base: Duration,
    /// Longest delay between two attempts (at least `--retry-base`).
    #[arg(long, default_value = "6h", value_parser = super::duration_within(Duration::from_millis(1), super::YEAR))]
    retry_max: Duration,
    /// Serve /metrics (Prometheus), /healthz (alive) and /readyz (Redis reachable, not
    /// draining) on this address, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Where a declared fenced sink lives: `NAME=URL` (repeatable), `redis://`, `rediss://`
    /// or `postgres://…[?schema=NAME&pool_size=N&pooler=transaction]` (default schema
    /// `palisade`, 8 connections; `pooler=transaction` behind PgBouncer or a pooler like it in
    /// transaction mode). Also `PALISADE_SINK_<NAME>_URL`; default: the coordinator's Redis.
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
    /// Do not take the scheduler role (by default every worker may: one at a time fires the
    /// binary's schedules and those kept in Redis).
    #[arg(long)]
    no_scheduler: bool,
    /// Do not change the schema of the postgres:// sinks: refuse to start unless it already has
    /// every migration this binary needs (`palisade migrate --plan`, then `--apply`, run them).
    /// By default each worker applies what is missing at start.
    #[arg(long)]
    no_migrate: bool,
    /// Also run an outbox relay for every postgres:// sink in this process (see `relay`).
    #[arg(long)]
    relay: bool,
    #[command(flatten)]
    relay_args: RelayArgs,
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
    #[arg(
        long,
        env = "PALISADE_EPOCH_POSTGRES_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    epoch_postgres: Option<String>,
    /// On SIGTERM / SIGINT, how long running handlers get to finish; jobs still running
    /// then are released back to ready (no attempt counted, no stall charged).
    #[arg(long, default_value = "30s", value_parser = super::duration_within(Duration::ZERO, super::DAY))]
    drain: Duration,
    /// Dead-lettered jobs kept per queue; the oldest go first (see `dead purge`).
    #[arg(long, default_value_t = DEFAULT_DEAD_RETENTION, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_DEAD_RETENTION as u64))]
    dead_retention: usize,
    /// How long a completed job is kept to be found by id (`job ID`, the API, the console's
    /// job page), with its times and attempts; `0s` keeps none. Give every worker the same:
    /// each applies its own to the jobs it completes.
    #[arg(long, default_value = "1d", value_parser = super::duration_within(Duration::ZERO, 365 * super::DAY))]
    keep_completed: Duration,
    /// At most this many completed jobs kept (the oldest go first); 0 keeps none.
    #[arg(long, default_value_t = palisade::CompletedRetention::default().max, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=palisade::limits::MAX_COMPLETED_KEPT as u64))]
    keep_completed_max: usize,
}

/// `name` or `name:weight` (weight 1..=100); spaces around either are ignored.
fn parse_queue(s: &str) -> Result<(String, u32), String> {
    let s = s.trim();
    let (name, weight) = match s.rsplit_once(':') {
        Some((name, w)) => match w.parse::<u32>() {
            Ok(w) if (1..=100).contains(&w) => (name, w),
            _ => return Err(format!("{s:?}: the weight after ':' must be 1..=100")),
        },
        None => (s, 1),
    };
    let name = name.trim();
    palisade::cli_support::check_name("queue", name).map_err(|e| e.to_string())?;
    Ok((name.to_owned(), weight))
}

/// The claim rotation for weighted queues: `a:2,b` → `[a, b, a]`, spread rather than
/// bunched, so a heavy queue does not starve the others between its turns.
fn rotation(queues: &[(String, u32)]) -> Vec<String> {
    let rounds = queues.iter().map(|(_, w)| *w).max().unwrap_or(1);
    (0..rounds)
        .flat_map(|round| {
            queues
                .iter()
                .filter(move |(_, w)| *w > round)
                .map(|(q, _)| q.clone())
        })
        .collect()
}

/// Runs the worker process until SIGTERM / SIGINT, then drains.
pub(super) fn run(
    args: WorkerArgs,
    registry: Registry,
    declared: &[String],
    schedules: Vec<palisade::Schedule>,
) -> anyhow::Result<()> {
    let arbiters = check(&args, &registry)?;
    let sink_urls = sink_urls(
        declared,
        &args.sinks,
        &super::sinks::environment(),
        &args.redis.redis,
    )?;
    for (name, url) in &sink_urls {
        let redis = [
            "redis://",
            "rediss://",
            "redis+sentinel://",
            "rediss+sentinel://",
        ];
        if is_postgres(url) {
            // Its TLS settings are checked now, not after the coordinator is reached.
            palisade::cli_support::check_tls(url).with_context(|| format!("sink {name}"))?;
        } else if !redis.iter().any(|s| url.starts_with(s)) {
            bail!(
                "sink {name}: {} is not a redis://, rediss://, redis+sentinel:// or postgres:// URL",
                redacted(url)
            );
        }
    }
    if args.relay {
        args.relay_args.check()?;
    } else if args.relay_args.has_targets() {
        bail!("--target only matters with --relay (or use the `relay` command)");
    }
    let health = Health::new();
    // (Its own runtime cannot start inside the System's; the signal handlers are installed
    // first thing inside, microseconds after /healthz starts answering.)
    if let Some(addr) = args.metrics {
        palisade::metrics::serve(addr, health.clone())
            .with_context(|| format!("serving /metrics on {addr}"))?;
        palisade::metrics::start_at_zero(&palisade::metrics::Expected {
            queues: args.queues.iter().map(|(q, _)| q.clone()).collect(),
            kinds: registry.kinds().map(str::to_owned).collect(),
            sinks: sink_urls.iter().map(|(name, _)| name.clone()).collect(),
            targets: if args.relay {
                args.relay_args.target_names()
            } else {
                Vec::new()
            },
            schedules: schedules.iter().map(|s| s.name().to_owned()).collect(),
        });
    }
    let name = args.name.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            palisade::cli_support::hostname(),
            std::process::id()
        )
    });
    System::new().block_on(async move {
        // Before anything slow: a SIGTERM or Ctrl-C while the backends are reached (each may
        // be waited for up to a minute) stops the process before it claims anything.
        let mut signals = super::Signals::listen();
        let connect = async {
            let epochs = epoch_source(&args).await?;
            let (pool, store) = args
                .redis
                .store_with(palisade::DEFAULT_MAX_PAYLOAD_BYTES, |store| {
                    let store = store
                        .with_dead_retention(args.dead_retention)
                        .with_completed_retention(palisade::CompletedRetention {
                            keep: args.keep_completed,
                            max: args.keep_completed_max,
                        });
                    match &epochs {
                        Some(source) => store.with_epoch_source(source.clone()),
                        None => store,
                    }
                })
                .await?;
            let coordinator = pool.clone();
            let backends = connect_sinks(&args, &sink_urls, pool).await?;
            // Before any job runs: one sink in two places splits its fence.
            super::sinks::check_identities(&coordinator, &args.redis.prefix, &backends.identities)
                .await?;
            let relays = if args.relay {
                args.relay_args.start(&backends.postgres, &args.redis).await?
            } else {
                Vec::new()
            };
            anyhow::Ok((store, backends, relays))
        };
        let (store, backends, _relays) = tokio::select! {
            connected = connect => connected?,
            () = signals.recv() => {
                tracing::info!(worker = %name, "signal received while starting; exiting before claiming any job");
                return anyhow::Ok(());
            }
        };
        // This binary's schedules are kept in the coordinator, so that whichever worker holds
        // the scheduler role — of this binary or another — fires them.
        for schedule in &schedules {
            store
                .put_schedule(schedule.spec().clone())
                .await
                .with_context(|| format!("keeping schedule {}", schedule.name()))?;
        }
        let _scheduler =
            (!args.no_scheduler).then(|| palisade::Scheduler::new(store.clone(), Vec::new()).start());
        let coordinator = Coordinator::new(store)
            .with_reap_interval((args.lease / 4).min(Duration::from_secs(1)))
            // Only a process that exports metrics may take the sampler role.
            .with_sample_interval(args.metrics.map(|_| Duration::from_secs(5)))
            .start();
        let workers = start_workers(&args, &name, arbiters, &coordinator, &registry, &backends.sinks)?;
        tracing::info!(worker = %name, arbiters, redis = %redacted(&args.redis.redis), metrics = ?args.metrics, queues = ?args.queues, sinks = ?sink_urls.iter().map(|(n, u)| format!("{n}={}", redacted(u))).collect::<Vec<_>>(), "worker started");

        // Ready while every backend answers and we are not draining.
        let draining = Arc::new(AtomicBool::new(false));
        watch_readiness(&backends, health.clone(), draining.clone());

        signals.recv().await;
        draining.store(true, Ordering::Relaxed);
        health.set_ready(false);
        tracing::info!(worker = %name, deadline = ?args.drain, "signal received; draining (a second signal releases running jobs and exits now)");
        let addrs: Vec<Addr<Worker>> = workers.iter().map(|(_, addr)| addr.clone()).collect();
        let drained = drain(workers, args.drain);
        tokio::pin!(drained);
        let released = tokio::select! {
            released = &mut drained => released?,
            // A signal within a second of the first is the same stop asked twice (a Ctrl-C
            // to a process group under foreman, a supervisor's SIGTERM beside it), not an
            // operator asking to cut the drain short.
            () = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                // A fresh listener: one made now does not hear the signals of that second.
                super::shutdown_signal().await
            } => {
                tracing::warn!(worker = %name, "second signal: releasing running jobs and exiting now");
                for addr in &addrs {
                    addr.do_send(Drain { deadline: Duration::ZERO });
                }
                drained.await?
            }
        };
        tracing::info!(worker = %name, released, "drained; exiting");
        anyhow::Ok(())
    })
}

/// Refuses flags that cannot work before anything starts; the number of arbiters to run.
fn check(args: &WorkerArgs, registry: &Registry) -> anyhow::Result<usize> {
    // The coordinator's URL first: the sinks default to it, and would take the blame.
    super::redis_url(&args.redis.redis, args.redis.redis_cluster)
        .map_err(|e| anyhow::anyhow!("--redis: {e}"))?;
    let arbiters = args
        .arbiters
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if !(1..=256).contains(&arbiters) {
        bail!("--arbiters must be 1..=256");
    }
    if args.linger > args.lease / 10 {
        bail!("--linger must be at most a tenth of --lease");
    }
    if args.retry_max < args.retry_base {
        bail!("--retry-max must be at least --retry-base");
    }
    let mut seen = std::collections::HashSet::new();
    if let Some((dup, _)) = args.queues.iter().find(|(q, _)| !seen.insert(q.clone())) {
        bail!("--queues names {dup:?} twice (give it one weight instead)");
    }
    palisade::cli_support::check_prefix(&args.redis.prefix)?;
    if let Some(name) = &args.name {
        palisade::cli_support::check_name("worker name", name)?;
    }
    if registry.kinds().next().is_none() {
        bail!("the registry has no job kinds: register a handler before running workers");
    }
    // A durable epoch file that cannot serve (corrupt, exhausted, unwritable) would make
    // every claim fail: refuse to start instead.
    if let Some(path) = &args.epoch_file {
        FileEpochSource::new(path)
            .check()
            .with_context(|| format!("--epoch-file {}", path.display()))?;
    }
    Ok(arbiters)
}

/// The durable epoch source the flags name, if any.
async fn epoch_source(args: &WorkerArgs) -> anyhow::Result<Option<Arc<dyn palisade::EpochSource>>> {
    let mut epochs: Option<Arc<dyn palisade::EpochSource>> = None;
    if let Some(path) = &args.epoch_file {
        epochs = Some(Arc::new(FileEpochSource::new(path)));
    }
    if let Some(url) = &args.epoch_postgres {
        let url = palisade::cli_support::with_default_root(url, args.redis.ca_file().as_deref())?;
        let source =
            PostgresEpochSource::connect_until_ready(&url, &args.redis.prefix, STARTUP_PATIENCE)
                .await
                .context("connecting to the Postgres epoch source")?;
        epochs = Some(Arc::new(source));
    }
    Ok(epochs)
}

/// What the process's sinks run on: every Redis it reaches (the coordinator's first) and every
/// Postgres sink, and the sinks over them for the handlers.
struct Backends {
    /// One pool per distinct URL: sinks on the coordinator's Redis share its pool.
    pools: HashMap<String, Target>,
    postgres: Vec<(String, Arc<PostgresSink>)>,
    sinks: Sinks,
    /// Each sink's name, what its store says it is, and its URL.
    identities: Vec<(String, String, String)>,
}

/// Connects every sink (a Postgres one both as `ctx.sink` and `ctx.postgres`).
async fn connect_sinks(
    args: &WorkerArgs,
    sink_urls: &[(String, String)],
    coordinator: Target,
) -> anyhow::Result<Backends> {
    let mut pools: HashMap<String, Target> = HashMap::new();
    pools.insert(args.redis.redis.clone(), coordinator);
    let mut sinks = Sinks::new();
    let migrations = if args.no_migrate {
        Migrations::Check
    } else {
        Migrations::Apply
    };
    let postgres = postgres_sinks(sink_urls, args.redis.ca_file().as_deref(), migrations).await?;
    let mut identities = Vec::new();
    let url_of = |sink: &str| {
        let found = sink_urls.iter().find(|(name, _)| name == sink);
        found.map(|(_, url)| url.clone()).unwrap_or_default()
    };
    for (sink, pg) in &postgres {
        // A role that may not read the cluster's identifier: the URL's place stands in.
        let identity = match pg
            .identity()
            .await
            .with_context(|| format!("sink {sink}"))?
        {
            Some(identity) => identity,
            None => super::sinks::location(&url_of(sink)),
        };
        identities.push((sink.clone(), identity, url_of(sink)));
        let store = PostgresFencedStore::new(pg.clone());
        sinks = sinks
            .with(
                sink.clone(),
                FencedSink::new(sink.clone(), Arc::new(store)).start(),
            )
            .with_postgres(sink.clone(), pg.clone());
    }
    for (sink, url) in sink_urls.iter().filter(|(_, url)| !is_postgres(url)) {
        if !pools.contains_key(url) {
            let what = format!("the Redis of sink {sink}");
            pools.insert(url.clone(), args.redis.reachable(url, &what).await?);
        }
        let store =
            RedisFencedStore::new(pools[url].clone(), &format!("{}-{sink}", args.redis.prefix));
        let identity = store
            .identity()
            .await
            .with_context(|| format!("sink {sink}"))?;
        identities.push((sink.clone(), identity, url.clone()));
        sinks = sinks.with(
            sink.clone(),
            FencedSink::new(sink.clone(), Arc::new(store)).start(),
        );
    }
    Ok(Backends {
        pools,
        postgres,
        sinks,
        identities,
    })
}

/// One `Worker` per arbiter thread, named `<name>` or `<name>/<i>`.
fn start_workers(
    args: &WorkerArgs,
    name: &str,
    arbiters: usize,
    coordinator: &Addr<Coordinator>,
    registry: &Registry,
    sinks: &Sinks,
) -> anyhow::Result<Vec<(Arbiter, Addr<Worker>)>> {
    let queues = rotation(&args.queues);
    let mut workers = Vec::with_capacity(arbiters);
    for i in 0..arbiters {
        let config = WorkerConfig {
            queues: queues.clone(),
            concurrency: args.concurrency,
            batch: args.concurrency,
            lease_ttl: args.lease,
            linger: args.linger,
            retry: palisade::RetryPolicy {
                base: args.retry_base,
                max: args.retry_max,
            },
            poll_interval: Duration::from_millis(20),
            ..WorkerConfig::new(if arbiters == 1 {
                name.to_owned()
            } else {
                format!("{name}/{i}")
            })
        };
        let worker = Worker::new(config, coordinator.clone(), registry.clone(), sinks.clone())?;
        let arbiter = Arbiter::new();
        let addr = Worker::start_in_arbiter(&arbiter.handle(), move |_| worker);
        workers.push((arbiter, addr));
    }
    Ok(workers)
}

/// Sets `/readyz` every second: ready while every backend answers and the process is not
/// draining.
fn watch_readiness(backends: &Backends, health: Health, draining: Arc<AtomicBool>) {
    let probes: Vec<Target> = backends.pools.values().cloned().collect();
    let pg_probes: Vec<Arc<PostgresSink>> =
        backends.postgres.iter().map(|(_, pg)| pg.clone()).collect();
    // Every probe at once, each bounded: a Redis that stopped answering (SIGSTOP, a
    // blackholed link) would otherwise hold a PING for the whole response timeout (10 s),
    // and /readyz would say ready all that while. Not ready within PROBE + EVERY (1.3 s).
    const PROBE: Duration = Duration::from_millis(800);
    const EVERY: Duration = Duration::from_millis(500);
    actix::spawn(async move {
        loop {
            let redis = probes
                .iter()
                .map(|probe| async move { tokio::time::timeout(PROBE, ping(probe)).await });
            let postgres = pg_probes
                .iter()
                .map(|probe| async move { tokio::time::timeout(PROBE, probe.ping()).await });
            let (redis, postgres) = futures_util::future::join(
                futures_util::future::join_all(redis),
                futures_util::future::join_all(postgres),
            )
            .await;
            let up = redis.iter().all(|r| matches!(r, Ok(Ok(_))))
                && postgres.iter().all(|r| matches!(r, Ok(Ok(_))));
            health.set_ready(up && !draining.load(Ordering::Relaxed));
            tokio::time::sleep(EVERY).await;
        }
    });
}

/// Drains every worker by `deadline` and stops their threads; how many jobs were released.
/// Jobs that could be neither settled nor released are an error (their leases expire and the
/// reaper requeues them).
async fn drain(workers: Vec<(Arbiter, Addr<Worker>)>, deadline: Duration) -> anyhow::Result<usize> {
    let drains = workers
        .iter()
        .map(|(_, addr)| addr.send(Drain { deadline }));
    let (mut released, mut unsettled) = (0, 0);
    for drained in futures_util::future::join_all(drains)
        .await
        .into_iter()
        .flatten()
    {
        released += drained.released;
        unsettled += drained.unsettled;
    }
    for (arbiter, _) in workers {
        arbiter.stop();
    }
    if unsettled > 0 {
        bail!(
            "{unsettled} jobs could not be settled or released before exiting (is Redis \
             reachable?); their leases expire and the reaper requeues them as stalls"
        );
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_queues_rotate_spread_out() {
        let q = |s: &str| parse_queue(s).unwrap();
        assert_eq!(q("critical:3"), ("critical".into(), 3));
        assert_eq!(q("default"), ("default".into(), 1));
        assert!(parse_queue("x:0").is_err());
        assert!(parse_queue("x:101").is_err());
        assert!(parse_queue(":2").is_err());
        let r = rotation(&[q("a:3"), q("b"), q("c:2")]);
        assert_eq!(r, ["a", "b", "c", "a", "c", "a"]);
    }
}
