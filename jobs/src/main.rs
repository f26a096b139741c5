//! The `palisade` binary: [`palisade::cli::App`] over the sample jobs (`worker`, `enqueue`,
//! `status`, `dead`), plus the embedded `demo`.

use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use palisade_jobs::demo::DemoArgs;
use palisade_jobs::soak::SoakArgs;

// Palisade allocates per job; mimalloc runs the embedded path ~25 % faster than glibc malloc
// (README, Performance). A user's own binary makes the same choice for itself.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let demo = DemoArgs::augment_args(clap::Command::new("demo").about(
        "Run thousands of jobs on the embedded (in-memory) backends with one worker paused past \
         its lease, then check that the fenced sink refused its late write.",
    ));
    let soak = SoakArgs::augment_args(clap::Command::new("soak").about(
        "Chaos soak: worker processes, a private Redis and Postgres, a seeded nemesis (SIGSTOP, \
         kill -9, Redis restarts and pauses), then an offline check of every invariant.",
    ));
    palisade::cli::App::new(palisade_jobs::registry())
        .name("palisade")
        .about("Palisade: a job runtime where an expired lease holder can keep running but can no longer write.")
        .sink(palisade_jobs::LEDGER)
        .sink(palisade_jobs::soak::BOOKS)
        .subcommand(demo, |matches| {
            let run = DemoArgs::from_arg_matches(matches)
                .map_err(anyhow::Error::from)
                .and_then(palisade_jobs::demo::run);
            match run {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("palisade demo: {e:#}");
                    ExitCode::from(2)
                }
            }
        })
        .subcommand(soak, |matches| {
            let run = SoakArgs::from_arg_matches(matches)
                .map_err(anyhow::Error::from)
                .and_then(palisade_jobs::soak::run);
            match run {
                Ok(report) => {
                    palisade_jobs::soak::print(&report);
                    if report.violations.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("palisade soak: {e:#}");
                    ExitCode::from(2)
                }
            }
        })
        .run()
}
