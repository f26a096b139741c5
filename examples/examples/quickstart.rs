//! Define a job, run it on the embedded backends, read what it wrote.
//!
//! `cargo run -p palisade-examples --example quickstart`

use std::{sync::Arc, time::Duration};

use actix::prelude::*;
use palisade::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Greet {
    name: String,
}

async fn greet(ctx: JobContext, g: Greet) -> Result<(), JobError> {
    let write = Mutation::Set {
        key: format!("greeting:{}", g.name),
        value: format!("hello, {}", g.name),
    };
    ctx.sink("greetings")?
        .write(vec![write])
        .await?
        .accepted()?; // fenced by this job's lease
    Ok(())
}

#[actix::main]
async fn main() -> anyhow::Result<()> {
    let coordinator = Coordinator::new(Arc::new(MemoryLeaseStore::new())).start();
    let store = Arc::new(MemoryFencedStore::new());
    let sinks = Sinks::new().with(
        "greetings",
        FencedSink::new("greetings", store.clone()).start(),
    );
    let registry = Registry::new().register("greet", greet);
    Worker::new(
        WorkerConfig::new("quickstart"),
        coordinator.clone(),
        registry,
        sinks,
    )?
    .start();

    let job = NewJob::new("greet", &Greet { name: "ada".into() })?.with_scope("person:ada");
    coordinator.send(Enqueue(vec![job])).await??;
    while coordinator
        .send(CountJobs("default".into()))
        .await??
        .pending()
        > 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("{:?}", store.read("greeting:ada").await?);
    Ok(())
}
