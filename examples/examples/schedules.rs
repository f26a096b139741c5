//! A recurring job: every second for three seconds, on the embedded backends, with two
//! schedulers racing for every tick — and one job per tick.
//!
//! `cargo run -p palisade-examples --example schedules`

use std::{sync::Arc, time::Duration};

use actix::prelude::*;
use palisade::*;

#[actix::main]
async fn main() -> anyhow::Result<()> {
    let store = Arc::new(MemoryLeaseStore::new());
    let coordinator = Coordinator::new(store.clone()).start();
    let registry = Registry::new().register("tick", |ctx: JobContext, _: ()| async move {
        println!("tick job {} ran", ctx.job().id);
        Ok(())
    });
    Worker::new(
        WorkerConfig::new("example"),
        coordinator,
        registry,
        Sinks::new(),
    )?
    .start();
    let every_second = Schedule::new("tick", "* * * * * *", NewJob::raw("tick", "null"))?;
    // Two schedulers, as two worker processes would run: one holds the role at a time, and
    // each tick's unique key turns away a second enqueue of it anyway.
    let _one = Scheduler::new(store.clone(), vec![every_second.clone()]).start();
    let _two = Scheduler::new(store.clone(), vec![every_second]).start();
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let counts = store.counts("default").await?;
    println!("jobs completed: {} (one per tick)", counts.completed);
    System::current().stop();
    Ok(())
}
