//! A user's worker binary: `worker`, `enqueue`, `status`, `dead` over their own jobs, and
//! `pending`, a command of its own that reaches the same coordinator.

use std::process::ExitCode;

use palisade::cli::{clap, App, Installation};

// Optional, the binary's choice: Palisade allocates per job, and mimalloc runs the embedded
// path ~25 % faster than glibc malloc (README, Performance).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let pending = clap::Command::new("pending")
        .about("Prints how many jobs of a queue are queued or running")
        .arg(clap::Arg::new("queue").default_value("default"));
    App::new(custom_worker::registry())
        .sink(custom_worker::INVENTORY)
        .subcommand_with(pending, print_pending)
        .run()
}

/// `pending [QUEUE]`: the same `--redis` / `--prefix` as every built-in command.
fn print_pending(installation: &Installation, args: &clap::ArgMatches) -> ExitCode {
    let queue = args.get_one::<String>("queue").expect("has a default");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let counted = match runtime {
        Ok(runtime) => runtime.block_on(async {
            match installation.client().await {
                Ok(client) => client.counts(queue).await.map_err(|e| e.to_string()),
                Err(e) => Err(format!("{e:#}")),
            }
        }),
        Err(e) => Err(e.to_string()),
    };
    match counted {
        Ok(counts) => {
            println!("{}", counts.pending());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pending: {e}");
            ExitCode::from(2)
        }
    }
}
