//! The `palisade` binary: [`palisade_cli::App`] over the sample jobs (`worker`, `enqueue`,
//! `status`, `dead`), plus the embedded `demo`.

use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use palisade_jobs::demo::DemoArgs;

// Palisade allocates per job; mimalloc runs the embedded path ~25 % faster than glibc malloc
// (docs/performance.md). A user's own binary makes the same choice for itself.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let demo = DemoArgs::augment_args(clap::Command::new("demo").about(
        "Run thousands of jobs on the embedded (in-memory) backends with one worker paused past \
         its lease, then check that the fenced sink refused its late write.",
    ));
    palisade_cli::App::new(palisade_jobs::registry())
        .name("palisade")
        .about("Palisade: a job runtime where an expired lease holder can keep running but can no longer write.")
        .sink(palisade_jobs::LEDGER)
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
        .run()
}
