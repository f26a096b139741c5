//! `relay` (and `worker --relay`): [`OutboxRelay`]s delivering the outboxes of the Postgres
//! sinks, to targets configured as `--target NAME=URL`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::{bail, Context as _};

use super::sinks::{postgres_sinks, sink_urls};
use super::RedisArgs;
use palisade::metrics::Health;
use palisade::store::postgres::{Migrations, PostgresSink};
use palisade::store::redis::redacted;
use palisade::Client;
use palisade::{OutboxRelay, OutboxTarget, RelayConfig};

/// Where outbox entries go, and how hard to try.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct RelayArgs {
    /// An outbox target: `NAME=URL` (repeatable). `http://…` or `https://…` receives one POST
    /// per entry (JSON body, `Idempotency-Key: <scope>/<key>`); `queue:QUEUE` enqueues each
    /// entry (`{"kind", "payload", "scope"}`) as a job into QUEUE of this coordinator.
    #[arg(long = "target", value_name = "NAME=URL")]
    targets: Vec<String>,
    /// Delivery attempts before an entry is dead.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1000))]
    outbox_attempts: u32,
    /// How long a relay holds an entry it is delivering (a delivery times out at half of it);
    /// another relay takes the entry after this if the first died.
    #[arg(long, default_value = "60s", value_parser = super::duration_within(Duration::from_secs(1), super::DAY))]
    outbox_lease: Duration,
    /// Delay before the second attempt; doubles per attempt (jittered), at most 10 minutes.
    #[arg(long, default_value = "1s", value_parser = super::duration_within(Duration::ZERO, super::DAY))]
    outbox_backoff: Duration,
}

/// `relay`: only the relays, no handlers.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct RelayCommand {
    #[command(flatten)]
    redis: RedisArgs,
    /// Where a declared sink lives, `NAME=URL` (repeatable; also `PALISADE_SINK_<NAME>_URL`):
    /// the outbox of every `postgres://` sink is relayed.
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
    #[command(flatten)]
    relay: RelayArgs,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Do not change the sinks' schema: refuse to start unless it has every migration this
    /// binary needs (as `worker --no-migrate`).
    #[arg(long)]
    no_migrate: bool,
}

/// `outbox list|retry`: the outboxes of the postgres:// sinks.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum OutboxCommand {
    /// Entries by state, and the dead ones with their last error.
    List(OutboxArgs),
    /// Give dead entries a fresh set of attempts (pending again, due now).
    Retry(OutboxArgs),
}

/// Which sinks, how many entries.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct OutboxArgs {
    /// Where a declared sink lives, `NAME=postgres://…` (repeatable; also
    /// `PALISADE_SINK_<NAME>_URL`).
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
    /// Most dead entries listed or retried per sink, oldest first.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// PEM certificate authority for sinks with sslmode=verify-ca|verify-full and no
    /// sslrootcert of their own.
    #[arg(long, env = "PALISADE_CA_FILE", value_name = "PATH")]
    ca_file: Option<std::path::PathBuf>,
}

/// Runs `outbox list` or `outbox retry`.
pub(super) fn outbox(command: OutboxCommand, declared: &[String]) -> anyhow::Result<()> {
    let (args, retry) = match command {
        OutboxCommand::List(args) => (args, false),
        OutboxCommand::Retry(args) => (args, true),
    };
    let urls = sink_urls(declared, &args.sinks, &super::sinks::environment(), "")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let ca = super::ca_file_or_env(args.ca_file.clone());
        // (A read, and a retry of entries: never a change to the schema behind the operator.)
        let sinks = postgres_sinks(&urls, ca.as_deref(), Migrations::Check).await?;
        if sinks.is_empty() {
            bail!(
                "no postgres:// sink given (--sink NAME=postgres://… or PALISADE_SINK_<NAME>_URL)"
            );
        }
        for (name, sink) in sinks {
            if retry {
                let n = sink.outbox_retry_dead(args.limit).await?;
                println!("{name}: {n} dead entries pending again");
                continue;
            }
            let c = sink.outbox_counts().await?;
            println!(
                "{name}: pending {}, delivered {}, dead {}",
                c.pending, c.delivered, c.dead
            );
            for (id, target, key, attempts, error) in sink.outbox_dead(args.limit).await? {
                println!("  dead #{id} {target} {key} after {attempts} attempts: {error}");
            }
        }
        anyhow::Ok(())
    })
}

/// `NAME=URL` flags, checked before anything connects.
fn parse_targets(flags: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut seen = std::collections::HashSet::new();
    flags
        .iter()
        .map(|flag| {
            let Some((name, url)) = flag.split_once('=') else {
                bail!("--target {flag:?}: expected NAME=URL");
            };
            palisade::cli_support::check_key_part("outbox target", name)?;
            let known = url.starts_with("http://")
                || url.starts_with("https://")
                || url.strip_prefix("queue:").is_some_and(|q| !q.is_empty());
            if !known {
                bail!("--target {name}: {url:?} is neither http(s)://… nor queue:QUEUE");
            }
            if !seen.insert(name.to_owned()) {
                bail!("--target {name} is given twice");
            }
            Ok((name.to_owned(), url.to_owned()))
        })
        .collect()
}

impl RelayArgs {
    /// The names of the `--target`s given (those that parse).
    pub(super) fn target_names(&self) -> Vec<String> {
        parse_targets(&self.targets)
            .map(|all| all.into_iter().map(|(name, _)| name).collect())
            .unwrap_or_default()
    }

    /// Whether any `--target` was given.
    pub(super) fn has_targets(&self) -> bool {
        !self.targets.is_empty()
    }

    /// Checks the flags (before the process connects anywhere).
    pub(super) fn check(&self) -> anyhow::Result<()> {
        if self.targets.is_empty() {
            bail!("a relay needs at least one --target NAME=URL");
        }
        parse_targets(&self.targets).map(drop)
    }

    /// Starts one relay per sink on the current arbiter.
    pub(super) async fn start(
        &self,
        sinks: &[(String, Arc<PostgresSink>)],
        redis: &RedisArgs,
    ) -> anyhow::Result<Vec<Addr<OutboxRelay>>> {
        if sinks.is_empty() {
            bail!("no postgres:// sink to relay (give one with --sink NAME=postgres://…)");
        }
        let mut client = None;
        let mut targets = HashMap::new();
        for (name, url) in parse_targets(&self.targets)? {
            let target = match url.strip_prefix("queue:") {
                Some(queue) => {
                    palisade::cli_support::check_name("queue", queue)?;
                    if client.is_none() {
                        let (_, store) = redis.store().await?;
                        client = Some(Client::new(store));
                    }
                    OutboxTarget::Enqueue {
                        client: client.clone().expect("just set"),
                        queue: queue.to_owned(),
                    }
                }
                None => OutboxTarget::Http(url),
            };
            targets.insert(name, target);
        }
        let config = RelayConfig {
            lease: self.outbox_lease,
            max_attempts: self.outbox_attempts,
            backoff: self.outbox_backoff,
            ca_file: redis.ca_file(),
            ..RelayConfig::default()
        };
        let mut relays = Vec::new();
        for (name, sink) in sinks {
            let config = RelayConfig {
                sink: name.clone(),
                ..config.clone()
            };
            let relay = OutboxRelay::new(sink.clone(), targets.clone(), config)
                .with_context(|| format!("relay of sink {name}"))?;
            relays.push(relay.start());
        }
        tracing::info!(sinks = ?sinks.iter().map(|(n, _)| n).collect::<Vec<_>>(), targets = ?self.targets.iter().map(|t| redacted(t)).collect::<Vec<_>>(), "outbox relay started");
        Ok(relays)
    }
}

/// Runs relays until SIGTERM / SIGINT.
pub(super) fn run(args: RelayCommand, declared: &[String]) -> anyhow::Result<()> {
    args.relay.check()?;
    let sink_urls = sink_urls(
        declared,
        &args.sinks,
        &super::sinks::environment(),
        &args.redis.redis,
    )?;
    let health = Health::new();
    if let Some(addr) = args.metrics {
        palisade::metrics::serve(addr, health.clone())
            .with_context(|| format!("serving /metrics on {addr}"))?;
        palisade::metrics::start_at_zero(&palisade::metrics::Expected {
            targets: args.relay.target_names(),
            ..palisade::metrics::Expected::default()
        });
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    System::new().block_on(async move {
        let mut signals = super::Signals::listen();
        let migrations = if args.no_migrate {
            Migrations::Check
        } else {
            Migrations::Apply
        };
        let sinks = postgres_sinks(&sink_urls, args.redis.ca_file().as_deref(), migrations).await?;
        let _relays = args.relay.start(&sinks, &args.redis).await?;
        health.set_ready(true);
        signals.recv().await;
        // Entries being delivered now keep their lease until it runs out, then another relay
        // (or this one, restarted) delivers them again: at least once, nothing lost.
        tracing::info!("signal received; relay stopping");
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_before_anything_connects() {
        let ok = parse_targets(&[
            "email=https://hooks.example/receipts".into(),
            "followup=queue:billing".into(),
        ])
        .unwrap();
        assert_eq!(ok[1], ("followup".into(), "queue:billing".into()));
        for bad in [
            "email",
            "email=ftp://x",
            "=http://x",
            "email=queue:",
            "a/b=http://x",
        ] {
            assert!(parse_targets(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(parse_targets(&["a=http://x".into(), "a=http://y".into()]).is_err());
    }
}
