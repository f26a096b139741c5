//! The saga worker binary: Palisade's whole command line over the order saga, plus `setup`,
//! which creates the example's tables.

use std::process::ExitCode;

use clap::{Arg, Command};

fn main() -> ExitCode {
    let setup = Command::new("setup")
        .about("Create the charge and refund tables (in the URL's search_path)")
        .arg(
            Arg::new("database")
                .long("database")
                .required(true)
                .value_name("URL"),
        );
    palisade_cli::App::new(saga::registry())
        .about("Runs order sagas: reserve, charge, wait for approval, cool off, ship.")
        .sink(saga::LEDGER)
        .sink(saga::PAYMENTS)
        .subcommand(setup, |args| {
            let url: &String = args.get_one("database").expect("required");
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
                .and_then(|rt| rt.block_on(setup_tables(url)))
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("saga setup: {e}");
                    ExitCode::from(2)
                }
            }
        })
        .run()
}

async fn setup_tables(url: &str) -> Result<(), String> {
    // Connecting also creates the sink's own schema (fence, keys, outbox).
    let sink = palisade::PostgresSink::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let client = sink.pool().get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(saga::SCHEMA_SQL)
        .await
        .map_err(|e| e.to_string())
}
