//! A claim's and a settlement's Redis work apart: enqueues `--rounds` × `--batch` no-op jobs
//! (each with its id, as a `Client` gives it), then claims them `--batch` at a time, then
//! completes them `--batch` at a time, running `--phase-hook` before the claims, between and
//! after, so a Redis under callgrind is dumped once per phase (`benches/split.sh` does that
//! and prints instructions per job of each).
//!
//! `cargo run --release -p palisade-benches --bin split -- --redis redis://127.0.0.1:6391 --batch 24`

use std::process::Command;
use std::time::Duration;

use clap::Parser;
use palisade::store::LeaseStore;
use palisade::{JobId, NewJob, Settlement};

#[derive(Parser)]
struct Args {
    /// A private Redis.
    #[arg(long)]
    redis: String,
    /// Jobs a claim and a settlement.
    #[arg(long, default_value_t = 24)]
    batch: usize,
    /// Claims (and settlements).
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// A shell command run at each phase's start and at the end.
    #[arg(long, default_value = "true")]
    phase_hook: String,
}

#[tokio::main]
async fn main() -> palisade::Result<()> {
    let args = Args::parse();
    let hook = || {
        let ran = Command::new("sh").arg("-c").arg(&args.phase_hook).status();
        assert!(ran.is_ok_and(|s| s.success()), "the phase hook failed");
    };
    let pool = palisade::store::redis::pool(&args.redis)?;
    let prefix = format!("split-{}", JobId::new());
    let store = palisade::store::redis::coordinator(
        pool,
        &prefix,
        1,
        0,
        palisade::DEFAULT_MAX_PAYLOAD_BYTES,
        |s| s,
    )?;
    for _ in 0..args.rounds {
        let jobs = (0..args.batch)
            .map(|_| NewJob::raw("noop", "null").with_id(JobId::new()))
            .collect();
        store.enqueue(jobs).await?;
    }
    hook();
    let mut claims = Vec::with_capacity(args.rounds);
    for _ in 0..args.rounds {
        let claim = store
            .claim("default", "split", args.batch, Duration::from_secs(600))
            .await?;
        assert_eq!(claim.len(), args.batch, "every job is claimed");
        claims.push(claim);
    }
    hook();
    for claim in claims {
        let done = store
            .settle(
                claim
                    .iter()
                    .map(|c| (c.lease.id, Settlement::completed()))
                    .collect(),
            )
            .await?;
        assert!(
            done.iter().all(|d| d.is_ok()),
            "every settlement is accepted"
        );
    }
    hook();
    println!("jobs {}", args.rounds * args.batch);
    Ok(())
}
