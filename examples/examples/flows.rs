//! A flow that fans out from a handler: `list` finds an album's photos when it runs and adds a
//! thumbnail step for each (`ctx.add_step`, kept with its completion; one thumbnail fails
//! once), then `archive` — which ran after `list`, so it waits for every thumbnail too —
//! reads their results, then `notify` after the archive. And a batch's
//! `on_success`/`on_complete` callbacks, with one child dead.
//!
//! `cargo run -p palisade-examples --example flows`

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use palisade::*;

#[actix::main]
async fn main() -> anyhow::Result<()> {
    let store = Arc::new(MemoryLeaseStore::new());
    let coordinator = Coordinator::new(store.clone())
        .with_reap_interval(Duration::from_millis(100))
        .start();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let flaky = Arc::new(AtomicU32::new(0));
    let registry = Registry::new()
        .register_with_result("thumbnail", {
            let flaky = flaky.clone();
            move |_: JobContext, photo: String| {
                let fail = photo.ends_with("b.jpg") && flaky.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if fail {
                        return Err(JobError::retry("image service timed out"));
                    }
                    Ok(format!("thumb-{photo}"))
                }
            }
        })
        .register_with_result("list", |ctx: JobContext, album: String| async move {
            // (Found when it runs: the flow did not know these steps when it was created.)
            let photos = ["a.jpg", "b.jpg", "c.jpg"].map(|p| format!("{album}/{p}"));
            let mut steps = Vec::new();
            for (i, photo) in photos.iter().enumerate() {
                let name = format!("thumb:{i}");
                ctx.add_step(&name, NewJob::new("thumbnail", photo)?, [])?;
                steps.push(added_step_name("list", &name));
            }
            Ok(steps)
        })
        .register_with_result("archive", |ctx: JobContext, _: ()| async move {
            let steps: Vec<String> = ctx.dependency("list").await?.unwrap_or_default();
            let mut files = Vec::new();
            for step in &steps {
                let thumb: Option<String> = ctx.dependency(step).await?;
                files.extend(thumb);
            }
            files.sort();
            Ok(format!("album.zip [{}]", files.join(", ")))
        })
        .register("notify", {
            let log = log.clone();
            move |ctx: JobContext, who: String| {
                let log = log.clone();
                async move {
                    let zip: Option<String> = ctx.dependency("archive").await?;
                    log.lock()
                        .unwrap()
                        .push(format!("{who}: {}", zip.unwrap_or_default()));
                    Ok(())
                }
            }
        })
        .register("import", |_: JobContext, n: u32| async move {
            if n == 2 {
                return Err(JobError::fatal("row 2 is malformed"));
            }
            Ok(())
        })
        .register("say", {
            let log = log.clone();
            move |_: JobContext, what: String| {
                log.lock().unwrap().push(what);
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

    let album = Flow::new()
        .step("list", NewJob::new("list", &"holiday")?)
        .step_after("archive", NewJob::new("archive", &())?, &["list"])
        .step_after(
            "notify",
            NewJob::new("notify", &"ann@example.com")?,
            &["archive"],
        );
    let id = client.create_flow(&album).await?;
    let done = client
        .wait_flow(id, Duration::from_secs(30))
        .await?
        .expect("the album flow finished");
    println!(
        "album flow: {:?}, {} steps completed",
        done.state,
        done.count(StepEnd::Completed)
    );
    assert_eq!(done.state, FlowState::Succeeded);

    let batch = Flow::batch((1..=3u32).map(|n| NewJob::new("import", &n).unwrap()))
        .on_success(NewJob::new("say", &"every row imported")?)
        .on_complete(NewJob::new("say", &"import finished")?);
    let id = client.create_flow(&batch).await?;
    let done = client
        .wait_flow(id, Duration::from_secs(30))
        .await?
        .expect("the batch finished");
    println!(
        "import batch: {:?} — completed {}, dead {}, skipped {}",
        done.state,
        done.count(StepEnd::Completed),
        done.count(StepEnd::Dead),
        done.count(StepEnd::Skipped)
    );
    let log = log.lock().unwrap().clone();
    println!("{log:#?}");
    assert_eq!(
        log,
        [
            "ann@example.com: album.zip [thumb-holiday/a.jpg, thumb-holiday/b.jpg, thumb-holiday/c.jpg]",
            "import finished"
        ]
    );
    assert_eq!(flaky.load(Ordering::SeqCst), 2, "b.jpg ran twice");
    System::current().stop();
    Ok(())
}
