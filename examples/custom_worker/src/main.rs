//! A user's worker binary: `worker`, `enqueue`, `status`, `dead` over their own jobs, and two
//! commands of its own that reach the same installation — `pending` (the coordinator) and
//! `stock` (the inventory sink).

use std::future::Future;
use std::process::ExitCode;

use palisade::Value;
use palisade_cli::{clap, App, Installation};

// Optional, the binary's choice: Palisade allocates per job, and mimalloc runs the embedded
// path ~25 % faster than glibc malloc (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let pending = clap::Command::new("pending")
        .about("Prints how many jobs of a queue are queued or running")
        .arg(clap::Arg::new("queue").default_value("default"));
    let stock = clap::Command::new("stock")
        .about("Prints how many of a SKU are reserved, as the inventory sink holds it")
        .arg(clap::Arg::new("sku").required(true));
    App::new(custom_worker::registry())
        .sink(custom_worker::INVENTORY)
        .subcommand_with(pending, print_pending)
        .subcommand_with(stock, print_stock)
        .run()
}

/// `pending [QUEUE]`: the same `--redis` / `--prefix` as every built-in command.
fn print_pending(installation: &Installation, args: &clap::ArgMatches) -> ExitCode {
    let queue = args.get_one::<String>("queue").expect("has a default");
    print(async {
        let client = installation.client().await.map_err(|e| format!("{e:#}"))?;
        let counts = client.counts(queue).await.map_err(|e| e.to_string())?;
        Ok(counts.pending().to_string())
    })
}

/// `stock SKU`: the sink's `--sink inventory=URL` (or its variable, or the coordinator's Redis),
/// exactly where the workers write it.
fn print_stock(installation: &Installation, args: &clap::ArgMatches) -> ExitCode {
    let sku = args.get_one::<String>("sku").expect("required");
    print(async {
        let sink = installation
            .sink(custom_worker::INVENTORY)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let reserved = match sink.read(&format!("stock:{sku}")).await {
            Ok(Some(Value::Hash(fields))) => fields.get("reserved").cloned(),
            Ok(_) => None,
            Err(e) => return Err(e.to_string()),
        };
        Ok(reserved.unwrap_or_else(|| "0".into()))
    })
}

/// Runs `answer` on a runtime of its own and prints it (exit 0), or its error (exit 2).
fn print(answer: impl Future<Output = Result<String, String>>) -> ExitCode {
    let answered = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|runtime| runtime.block_on(answer));
    match answered {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
