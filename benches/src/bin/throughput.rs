//! Throughput harness: enqueue N no-op jobs, run W workers × C concurrency, report jobs/s.
//!
//! `cargo run --release -p palisade-benches --bin throughput -- --jobs 200000`
//! (embedded in-memory coordinator; each worker on its own arbiter thread)

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use palisade::*;

/// Embedded throughput harness.
#[derive(clap::Parser)]
struct Args {
    /// No-op jobs to enqueue and run.
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Workers, each on its own arbiter thread.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Handlers per worker (also the claim batch size).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let system = System::new();
    system.block_on(async move {
        let coordinator = Coordinator::new(Arc::new(MemoryLeaseStore::new())).start();
        let t0 = Instant::now();
        let jobs: Vec<NewJob> = (0..args.jobs).map(|_| NewJob::raw("noop", "null")).collect();
        for chunk in jobs.chunks(10_000) {
            coordinator.send(Enqueue(chunk.to_vec())).await.unwrap().unwrap();
        }
        let enqueue = t0.elapsed();
        let t1 = Instant::now();
        let mut arbiters = Vec::new();
        for i in 0..args.workers {
            let config = WorkerConfig {
                concurrency: args.concurrency,
                batch: args.concurrency,
                poll_interval: Duration::from_millis(1),
                ..WorkerConfig::new(format!("bench-{i}"))
            };
            let registry = Registry::new().register("noop", |_: JobContext, _: ()| async { Ok(()) });
            let worker = Worker::new(config, coordinator.clone(), registry, Sinks::new()).unwrap();
            let arbiter = Arbiter::new();
            Worker::start_in_arbiter(&arbiter.handle(), move |_| worker);
            arbiters.push(arbiter);
        }
        loop {
            let counts = coordinator.send(CountJobs("default".into())).await.unwrap().unwrap();
            if counts.pending() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let run = t1.elapsed();
        println!(
            "embedded: {} no-op jobs, {} workers x {} concurrency: enqueue {:.0} jobs/s, run {:.0} jobs/s ({:.2}s)",
            args.jobs,
            args.workers,
            args.concurrency,
            args.jobs as f64 / enqueue.as_secs_f64(),
            args.jobs as f64 / run.as_secs_f64(),
            run.as_secs_f64()
        );
        System::current().stop();
    });
}
