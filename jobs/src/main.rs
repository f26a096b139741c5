//! The `palisade` binary: the embedded demo, and workers / enqueue / status / dead-letter
//! tools against Redis.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Palisade: a job runtime where an expired lease holder can keep running but can no longer
/// write.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run thousands of jobs on the embedded (in-memory) backends with one worker paused past
    /// its lease, then check that the fenced sink refused its late write.
    Demo(palisade_jobs::demo::DemoArgs),
    /// Run a worker process against Redis until SIGTERM / SIGINT, then drain.
    Worker(palisade_jobs::cli::WorkerArgs),
    /// Enqueue one job; prints its id.
    Enqueue(palisade_jobs::cli::EnqueueArgs),
    /// Show queue counts, live leases with their age, and a scope's newest token.
    Status(palisade_jobs::cli::StatusArgs),
    /// List, retry or purge dead-lettered jobs.
    #[command(subcommand)]
    Dead(palisade_jobs::cli::DeadCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own story; library warnings (stalls, refusals) would tear its
    // progress bar, so there they are opt-in through RUST_LOG. A worker logs what it does.
    let default_level = match cli.command {
        Command::Worker(_) => "info",
        Command::Demo(_) => "error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .init();
    let (name, result) = match cli.command {
        Command::Demo(args) => match palisade_jobs::demo::run(args) {
            Ok(true) => return ExitCode::SUCCESS,
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => ("demo", Err(e)),
        },
        Command::Worker(args) => (
            "worker",
            palisade_jobs::cli::check_worker(&args).and_then(|()| palisade_jobs::cli::worker(args)),
        ),
        Command::Enqueue(args) => ("enqueue", palisade_jobs::cli::enqueue(args)),
        Command::Status(args) => ("status", palisade_jobs::cli::status(args)),
        Command::Dead(command) => ("dead", palisade_jobs::cli::dead(command)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade {name}: {e:#}");
            ExitCode::from(2)
        }
    }
}
