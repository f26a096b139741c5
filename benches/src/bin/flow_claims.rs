//! Does a claim cost more when many flow steps wait? Holds `--held` flow steps (flows of
//! 1,000 steps that all run after a root parked in another queue, so none is ever released),
//! then enqueues `--jobs` plain jobs into the same queue and claims and settles them in
//! batches, reporting jobs/s and the Redis CPU per job (`INFO cpu` deltas).
//!
//! `cargo run --release -p palisade-benches --bin flow_claims -- --redis redis://127.0.0.1:6390 --held 100000`

use std::time::{Duration, Instant};

use clap::Parser;
use palisade::store::{LeaseStore, Stores};
use palisade::{Client, Flow, NewJob, Settlement};
use palisade_benches::redis_counters;

#[derive(Parser)]
struct Args {
    /// A private Redis (its CPU is measured).
    #[arg(long)]
    redis: String,
    /// Flow steps waiting (held) in the queue while the jobs are claimed.
    #[arg(long, default_value_t = 0)]
    held: usize,
    /// Plain jobs claimed and settled.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Jobs per claim.
    #[arg(long, default_value_t = 50)]
    batch: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let prefix = format!("fc{}", uuid::Uuid::new_v4().simple());
    let pool = palisade::store::redis::pool(&args.redis).unwrap();
    let stores: Stores =
        palisade::store::redis::coordinator(pool, &prefix, 1, 0, 1 << 20, |s| s).unwrap();
    let client = Client::new(stores.clone());
    let started = Instant::now();
    for _ in 0..args.held.div_ceil(1000) {
        let mut flow = Flow::new().step("root", NewJob::raw("k", "null").with_queue("parked"));
        for i in 0..999 {
            flow = flow.step_after(
                format!("s{i}"),
                NewJob::raw("k", "null").with_queue("bench"),
                &["root"],
            );
        }
        client.create_flow(&flow).await.unwrap();
    }
    let held_in = started.elapsed();
    for chunk in 0..args.jobs.div_ceil(1000) {
        let n = 1000.min(args.jobs - chunk * 1000);
        let jobs = (0..n)
            .map(|_| NewJob::raw("k", "null").with_queue("bench"))
            .collect();
        stores.enqueue(jobs).await.unwrap();
    }
    let cpu = redis_counters(&args.redis).await.0;
    let start = Instant::now();
    let mut done = 0;
    let mut claims = 0;
    while done < args.jobs {
        let got = stores
            .claim("bench", "w", args.batch, Duration::from_secs(60))
            .await
            .unwrap();
        claims += 1;
        if got.is_empty() {
            break;
        }
        done += got.len();
        let settlements = got
            .into_iter()
            .map(|c| (c.lease.id, Settlement::completed()))
            .collect();
        stores.settle(settlements).await.unwrap();
    }
    let took = start.elapsed();
    let cpu = redis_counters(&args.redis).await.0 - cpu;
    println!(
        "held {} (written in {:.1?}): {done} jobs in {claims} claims, {:.0} jobs/s, Redis CPU {:.1} µs per job",
        args.held,
        held_in,
        done as f64 / took.as_secs_f64(),
        cpu * 1e6 / done as f64
    );
}
