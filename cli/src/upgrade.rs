//! `upgrade plan | check | finalize`: the installation's format level (`palisade::format`)
//! and the live processes that share it, for a rolling deploy (docs/operations.md, "Rolling
//! deploys: two releases side by side").

use std::ops::RangeInclusive;

use anyhow::{bail, Context as _};
use clap::Subcommand;

use palisade::format::{self, LEVELS};
use palisade::store::redis::Installation;
use palisade::store::{ControlStore, WorkerBeat};

use super::{print_lines, runtime, RedisArgs};

/// `upgrade`.
#[derive(Clone, Debug, Subcommand)]
pub(super) enum UpgradeCommand {
    /// Show the installation's format level and layout, this binary's window of levels, each
    /// live worker's version and window, the postgres:// sinks' schema versions, and what
    /// `finalize` would do. Changes nothing; works whatever the level.
    Plan(UpgradeArgs),
    /// As `plan`, then exit non-zero when a live worker cannot read the installation's level
    /// or the level `finalize` would move to (or this binary cannot read it): run it before
    /// and after each step of a rolling deploy.
    Check(UpgradeArgs),
    /// Move the installation to this binary's highest format level (or `--to`), so that
    /// features writing that level's record shapes may be used; refused while a live worker
    /// could not read it. A level is never lowered: roll back before finalizing, not after.
    Finalize(FinalizeArgs),
}

/// The installation (and, for `plan` and `check`, the postgres:// sinks) to look at.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct UpgradeArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Where a declared postgres:// sink lives, `NAME=postgres://…` (repeatable; also
    /// `PALISADE_SINK_<NAME>_URL`): its schema version is shown too.
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
}

/// `upgrade finalize`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct FinalizeArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The level to move to (default: the highest this binary reads and writes).
    #[arg(long)]
    to: Option<u32>,
}

/// Runs an `upgrade` command.
pub(super) fn upgrade(command: UpgradeCommand, declared: &[String]) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        match command {
            UpgradeCommand::Plan(args) => {
                let report = report(&args, declared).await?;
                print_lines(report.lines.into_iter())
            }
            UpgradeCommand::Check(args) => {
                let report = report(&args, declared).await?;
                let outside = report.outside;
                print_lines(report.lines.into_iter())?;
                if let Some(problem) = report.problems.first() {
                    bail!("{problem}");
                }
                if outside > 0 {
                    bail!("{outside} live worker process(es) outside the window");
                }
                Ok(())
            }
            UpgradeCommand::Finalize(args) => finalize(args).await,
        }
    })
}

/// What `plan` prints, and what `check` decides on.
struct Report {
    lines: Vec<String>,
    /// What makes `check` fail, besides workers outside the window: this binary cannot read
    /// the level, a finalize did not finish, nothing records the installation, a sink's
    /// schema could not be read.
    problems: Vec<String>,
    /// How many live worker processes are outside the window (the current level to
    /// finalize's target).
    outside: usize,
}

async fn report(args: &UpgradeArgs, declared: &[String]) -> anyhow::Result<Report> {
    let (installation, live) = read(&args.redis).await?;
    let current = installation.format();
    let target = current.max(*LEVELS.end());
    let mut problems = Vec::new();
    let mut lines = vec![format!(
        "coordinator {:?}: {} partition(s), layout generation {}, format level {current}{}",
        args.redis.prefix,
        installation.partitions,
        installation.generation,
        match installation.recorded() {
            true => "",
            false => " (never recorded: release 0.1.0's format)",
        }
    )];
    if !installation.exists {
        problems.push(format!(
            "nothing records an installation under the prefix {:?}: check --prefix",
            args.redis.prefix
        ));
    }
    if installation.lagging() > 0 {
        problems.push(format!(
            "a finalize did not finish: {} of {} bases are below level {current}; run \
             `upgrade finalize --to {current}` again",
            installation.lagging(),
            installation.levels.len()
        ));
    }
    lines.push(format!(
        "this binary: palisade {}, reads and writes format levels {}",
        env!("CARGO_PKG_VERSION"),
        window(&LEVELS)
    ));
    let readable = LEVELS.contains(&current);
    if !readable {
        problems.push(format!(
            "this binary cannot run against level {current}: run a release that reads it"
        ));
    }
    lines.push(match (readable, target > current) {
        (false, _) => "finalize: not with this binary (see the problem below)".to_owned(),
        (true, true) => format!(
            "finalize would move the installation to level {target}: from then on, processes \
             reading only levels below it are refused"
        ),
        (true, false) => format!(
            "finalize has nothing to raise: this binary knows no level above {current}{}",
            match installation.recorded() {
                true => "",
                false => " (it would record the level)",
            }
        ),
    });
    // One line per process (a process beats once per worker it runs).
    let mut processes: Vec<(&WorkerBeat, usize)> = Vec::new();
    for beat in &live {
        match processes
            .iter_mut()
            .find(|(p, _)| (&p.host, p.pid) == (&beat.host, beat.pid))
        {
            Some((_, n)) => *n += 1,
            None => processes.push((beat, 1)),
        }
    }
    lines.push(format!("live worker processes: {}", processes.len()));
    let mut outside = 0;
    for (beat, workers) in processes {
        let theirs = format::window_of(beat);
        let fits = theirs.contains(&current) && theirs.contains(&target);
        outside += usize::from(!fits);
        lines.push(format!(
            "  {}{}{}",
            format::describe(beat),
            match workers {
                1 => String::new(),
                n => format!(" ({n} workers)"),
            },
            if fits { "" } else { "  <- outside the window" }
        ));
    }
    lines.push(if outside == 0 {
        format!("every live worker process reads levels {current} to {target}")
    } else {
        format!(
            "{outside} live worker process(es) cannot read every level from {current} to \
             {target}: upgrade or stop them first"
        )
    });
    let ca = args.redis.ca_file();
    for line in super::sinks::schema_lines(declared, &args.sinks, ca.as_deref()).await? {
        match line {
            Ok(line) => lines.push(line),
            Err(e) => {
                let line = format!("{e:#}");
                lines.push(line.clone());
                problems.push(line);
            }
        }
    }
    lines.extend(problems.iter().map(|p| format!("problem: {p}")));
    Ok(Report {
        lines,
        problems,
        outside,
    })
}

/// The installation's records and its live workers, read whatever the level.
async fn read(redis: &RedisArgs) -> anyhow::Result<(Installation, Vec<WorkerBeat>)> {
    palisade::cli_support::check_prefix(&redis.prefix)?;
    let target = redis.reachable(&redis.redis, "Redis").await?;
    let installation = palisade::store::redis::installation(target.clone(), &redis.prefix).await?;
    // (Reading heartbeats checks no level: a store of the installation's own layout.)
    let store = palisade::store::redis::coordinator(
        target,
        &redis.prefix,
        installation.partitions,
        installation.generation,
        palisade::DEFAULT_MAX_PAYLOAD_BYTES,
        |s| s,
    )?;
    let mut live = store.workers().await?;
    live.sort_by(|a, b| a.worker.cmp(&b.worker));
    Ok((installation, live))
}

async fn finalize(args: FinalizeArgs) -> anyhow::Result<()> {
    palisade::cli_support::check_prefix(&args.redis.prefix)?;
    let target = args.redis.reachable(&args.redis.redis, "Redis").await?;
    let to = args.to.unwrap_or(*LEVELS.end());
    // (The rule, the live workers and the installation are read under the layout lock.)
    let done = palisade::store::redis::finalize_format(target, &args.redis.prefix, to)
        .await
        .with_context(|| format!("finalize --to {to}"))?;
    let (before, level) = (&done.before, done.level);
    let line = if before.format() < level {
        format!(
            "format level {} -> {level}: processes reading only levels below {level} are refused \
             from now on",
            before.format()
        )
    } else if before.lagging() > 0 {
        format!(
            "format level {level} now recorded under every base ({} of {} were behind)",
            before.lagging(),
            before.levels.len()
        )
    } else if !before.recorded() {
        format!("format level {level} recorded (it was implied): nothing else changed")
    } else {
        format!("already at format level {level}: nothing changed")
    };
    print_lines(std::iter::once(line))
}

/// `1..=1` as an operator reads it.
fn window(levels: &RangeInclusive<u32>) -> String {
    match levels.start() == levels.end() {
        true => levels.start().to_string(),
        false => format!("{} to {}", levels.start(), levels.end()),
    }
}
