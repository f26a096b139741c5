//! The `palisade` binary: run the embedded demo (and, later, workers against Redis).

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own story; library warnings (stalls, refusals) would tear its
    // progress bar, so they are opt-in through RUST_LOG.
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Demo(args) => match palisade_jobs::demo::run(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("palisade demo: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}
