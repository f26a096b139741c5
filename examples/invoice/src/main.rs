//! The invoice worker binary: Palisade's whole command line over the invoice jobs, plus
//! `setup`, which creates the example's table and a few unpaid invoices.

use std::process::ExitCode;

use clap::{Arg, Command};

fn main() -> ExitCode {
    let setup = Command::new("setup")
        .about("Create the invoice table (in the URL's search_path) and unpaid invoices 1..=N")
        .arg(
            Arg::new("database")
                .long("database")
                .required(true)
                .value_name("URL"),
        )
        .arg(
            Arg::new("invoices")
                .long("invoices")
                .default_value("10")
                .value_parser(clap::value_parser!(i64).range(0..=1_000_000)),
        );
    palisade_cli::App::new(invoice::registry())
        .about("Settles invoices in Postgres, fenced, and sends receipts through the outbox.")
        .sink(invoice::BILLING)
        .subcommand(setup, |args| {
            let url: &String = args.get_one("database").expect("required");
            let n: i64 = *args.get_one("invoices").expect("defaulted");
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
                .and_then(|rt| rt.block_on(setup_tables(url, n)))
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("invoice setup: {e}");
                    ExitCode::from(2)
                }
            }
        })
        .run()
}

async fn setup_tables(url: &str, invoices: i64) -> Result<(), String> {
    // Connecting also creates the sink's own schema (fence, keys, outbox).
    let sink = palisade::PostgresSink::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let client = sink.pool().get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(invoice::SCHEMA_SQL)
        .await
        .map_err(|e| e.to_string())?;
    // (A simple-protocol batch, the number spliced in as a number: no statement is left on
    // the server connection, which behind a transaction pooler the next client may get.)
    client
        .batch_execute(&format!(
            "INSERT INTO invoice (id, total_cents) \
             SELECT i, 1000 * i FROM generate_series(1, {invoices}::bigint) i \
             ON CONFLICT (id) DO NOTHING"
        ))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}
