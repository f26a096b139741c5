//! A chain made of follow-up jobs: `resize` asks for `archive`, which asks for `notify`, each
//! carrying the previous step's output. A step's follow-ups exist only once its completion is
//! accepted — a run that fails (here the first `archive` attempt) adds nothing, and its retry
//! asks again.
//!
//! `cargo run -p palisade-examples --example follow_ups`

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use palisade::*;

#[actix::main]
async fn main() -> anyhow::Result<()> {
    let store = Arc::new(MemoryLeaseStore::new());
    let coordinator = Coordinator::new(store.clone()).start();
    let notified = Arc::new(Mutex::new(Vec::<String>::new()));
    let archive_attempts = Arc::new(AtomicU32::new(0));
    let registry = Registry::new()
        .register(
            "resize",
            |ctx: JobContext, photos: Vec<String>| async move {
                let thumbs: Vec<String> = photos.iter().map(|p| format!("thumb-{p}")).collect();
                ctx.follow_up(NewJob::new("archive", &thumbs)?)?;
                Ok(())
            },
        )
        .register("archive", {
            let attempts = archive_attempts.clone();
            move |ctx: JobContext, thumbs: Vec<String>| {
                let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let zip = format!("album.zip ({} files)", thumbs.len());
                    ctx.follow_up(NewJob::new("notify", &zip)?)?;
                    if attempt == 1 {
                        // Asked for `notify`, then failed: the follow-up goes with this run.
                        return Err(JobError::retry("storage hiccup"));
                    }
                    Ok(())
                }
            }
        })
        .register("notify", {
            let notified = notified.clone();
            move |_: JobContext, zip: String| {
                notified.lock().unwrap().push(zip);
                async { Ok(()) }
            }
        });
    let config = WorkerConfig {
        retry: RetryPolicy {
            base: Duration::from_millis(10),
            max: Duration::from_millis(50),
        },
        ..WorkerConfig::new("example")
    };
    Worker::new(config, coordinator, registry, Sinks::new())?.start();
    let client = Client::new(store);
    client
        .enqueue(NewJob::new("resize", &vec!["a.jpg", "b.jpg", "c.jpg"])?)
        .await?;
    for _ in 0..500 {
        if client.counts("default").await?.completed == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counts = client.counts("default").await?;
    let notified = notified.lock().unwrap().clone();
    println!(
        "completed {}, archive attempts {}, notified {notified:?}",
        counts.completed,
        archive_attempts.load(Ordering::SeqCst)
    );
    assert_eq!(counts.completed, 3, "resize, archive, notify: {counts:?}");
    assert_eq!(notified, ["album.zip (3 files)"], "notify ran once");
    System::current().stop();
    Ok(())
}
