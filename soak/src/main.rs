//! The `palisade-soak` binary: `soak` runs the chaos soak, and `worker` (with every other
//! command of [`palisade_cli::App`]) is the worker process the soak starts — the sample jobs,
//! the soak's `soak.post` kind, and its two sinks.

use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use palisade_soak::SoakArgs;

fn main() -> ExitCode {
    let soak = SoakArgs::augment_args(clap::Command::new("soak").about(
        "Chaos soak: worker processes, a private Redis and Postgres, a seeded nemesis (SIGSTOP, \
         kill -9, Redis restarts and pauses), then an offline check of every invariant.",
    ));
    let registry = palisade_jobs::registry().register(palisade_soak::POST, palisade_soak::post);
    palisade_cli::App::new(registry)
        .name("palisade-soak")
        .about("Palisade's chaos soak and the worker it runs. Not for production.")
        .sink(palisade_jobs::LEDGER)
        .sink(palisade_soak::BOOKS)
        .subcommand(soak, |matches| {
            let run = SoakArgs::from_arg_matches(matches)
                .map_err(anyhow::Error::from)
                .and_then(palisade_soak::run);
            match run {
                Ok(report) => {
                    palisade_soak::print(&report);
                    if report.violations.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("palisade-soak soak: {e:#}");
                    ExitCode::from(2)
                }
            }
        })
        .run()
}
