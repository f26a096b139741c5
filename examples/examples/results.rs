//! A job that answers: the handler's return value comes back to the producer, and its
//! progress is visible while it runs.
//!
//! `cargo run -p palisade-examples --example results`

use std::{sync::Arc, time::Duration};

use actix::prelude::*;
use palisade::*;

#[actix::main]
async fn main() -> anyhow::Result<()> {
    let store = Arc::new(MemoryLeaseStore::new());
    let coordinator = Coordinator::new(store.clone()).start();
    let registry = Registry::new().register_with_result(
        "invoice.total",
        |ctx: JobContext, lines: Vec<i64>| async move {
            ctx.progress(&format!("{} lines", lines.len()));
            Ok(lines.iter().sum::<i64>())
        },
    );
    Worker::new(
        WorkerConfig::new("example"),
        coordinator,
        registry,
        Sinks::new(),
    )?
    .start();
    let client = Client::new(store);
    let id = client
        .enqueue(NewJob::new("invoice.total", &vec![1200, 300, 45])?)
        .await?;
    let total: Option<i64> = client.wait(id, Duration::from_secs(5)).await?;
    println!(
        "job {id}: total {total:?}, progress {:?}",
        client.progress(id).await?
    );
    assert_eq!(total, Some(1545));
    System::current().stop();
    Ok(())
}
