//! Groups: is a claim fair to small groups behind a big one, and does its cost stay flat in
//! the number of groups?
//!
//! Fairness: `--backlog B` jobs of group `big` are enqueued first, then `--small G` groups of
//! `--per-group P` jobs each; one claimer takes `--batch` jobs a claim and settles them at
//! once (handlers that take no time), and the time from each small-group job's enqueue to
//! its claim is reported (p50, p99, max), with the claims it took to drain the small groups.
//! Compare `--backlog 100000` with `--backlog 0`.
//!
//! Cost: `--spread N` enqueues `--jobs` jobs over N groups (round robin) and claims and
//! settles them all, reporting jobs/s and, on Redis, commands and Redis CPU per job
//! (`INFO` deltas; use a Redis nothing else uses).
//!
//! `cargo run --release -p palisade-benches --bin groups -- [--redis redis://127.0.0.1:6390] --backlog 100000`
//! `cargo run --release -p palisade-benches --bin groups -- --redis redis://127.0.0.1:6390 --spread 1000 --jobs 100000`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use palisade::store::{LeaseStore, Stores};
use palisade::{JobId, NewJob, Settlement};
use palisade_benches::redis_counters;

#[derive(Parser)]
struct Args {
    /// A private Redis (its CPU is measured); without it, the embedded coordinator.
    #[arg(long)]
    redis: Option<String>,
    /// Fairness: jobs of the big group, enqueued first.
    #[arg(long, default_value_t = 0)]
    backlog: usize,
    /// Fairness: small groups, enqueued after the backlog.
    #[arg(long, default_value_t = 10)]
    small: usize,
    /// Fairness: jobs per small group.
    #[arg(long, default_value_t = 100)]
    per_group: usize,
    /// Cost: spread `--jobs` over this many groups instead (0: no groups at all).
    #[arg(long)]
    spread: Option<usize>,
    /// Cost: jobs enqueued, claimed and settled.
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Jobs per claim.
    #[arg(long, default_value_t = 50)]
    batch: usize,
    /// Fairness without groups: the same jobs, none of them grouped (the baseline).
    #[arg(long)]
    ungrouped: bool,
}

async fn enqueue(stores: &Stores, jobs: Vec<NewJob>) -> Vec<JobId> {
    let mut ids = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(1000) {
        ids.extend(stores.enqueue(chunk.to_vec()).await.unwrap());
    }
    ids
}

/// Claims and settles until nothing is left or `until` says stop; calls `seen` with every
/// claimed job's id and the claim's number. Returns the claims made.
async fn drain(stores: &Stores, batch: usize, mut seen: impl FnMut(JobId, usize) -> bool) -> usize {
    let mut claims = 0;
    loop {
        let got = stores
            .claim("bench", "w", batch, Duration::from_secs(60))
            .await
            .unwrap();
        if got.is_empty() {
            return claims;
        }
        claims += 1;
        let mut stop = false;
        for c in &got {
            stop |= seen(c.job.id, claims);
        }
        let settlements = got
            .into_iter()
            .map(|c| (c.lease.id, Settlement::completed()))
            .collect();
        for r in stores.settle(settlements).await.unwrap() {
            r.unwrap();
        }
        if stop {
            return claims;
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let prefix = format!("gb{}", uuid::Uuid::new_v4().simple());
    let stores: Stores = match &args.redis {
        Some(url) => {
            let pool = palisade::store::redis::pool(url).unwrap();
            palisade::store::redis::coordinator(pool, &prefix, 1, 0, 1 << 20, |s| s).unwrap()
        }
        None => std::sync::Arc::new(palisade::store::memory::MemoryLeaseStore::new()).into(),
    };
    let job = || NewJob::raw("k", "null").with_queue("bench");
    let backend = if args.redis.is_some() {
        "redis"
    } else {
        "memory"
    };

    if let Some(groups) = args.spread {
        let jobs: Vec<NewJob> = (0..args.jobs)
            .map(|i| match groups {
                0 => job(),
                g => job().with_group(format!("tenant:{}", i % g)),
            })
            .collect();
        enqueue(&stores, jobs).await;
        let before = match &args.redis {
            Some(url) => redis_counters(url).await,
            None => (0.0, 0),
        };
        let start = Instant::now();
        let mut done = 0;
        let claims = drain(&stores, args.batch, |_, _| {
            done += 1;
            false
        })
        .await;
        let took = start.elapsed();
        let per_job = match &args.redis {
            Some(url) => {
                let after = redis_counters(url).await;
                format!(
                    ", Redis CPU {:.1} µs and {:.1} commands per job",
                    (after.0 - before.0) * 1e6 / done as f64,
                    (after.1 - before.1) as f64 / done as f64
                )
            }
            None => String::new(),
        };
        println!(
            "{backend} spread over {groups} groups: {done} jobs in {claims} claims, {:.0} jobs/s{per_job}",
            done as f64 / took.as_secs_f64()
        );
        return;
    }

    let in_group = |job: NewJob, group: String| match args.ungrouped {
        true => job,
        false => job.with_group(group),
    };
    enqueue(
        &stores,
        (0..args.backlog)
            .map(|_| in_group(job(), "big".into()))
            .collect(),
    )
    .await;
    let small: Vec<NewJob> = (0..args.small * args.per_group)
        .map(|i| in_group(job(), format!("small:{}", i % args.small)))
        .collect();
    let total = small.len();
    let mut enqueued: HashMap<JobId, Instant> = HashMap::with_capacity(total);
    for chunk in small.chunks(1000) {
        let ids = stores.enqueue(chunk.to_vec()).await.unwrap();
        let at = Instant::now();
        enqueued.extend(ids.into_iter().map(|id| (id, at)));
    }
    let mut waits = Vec::with_capacity(total);
    let mut last_claim = 0;
    let claims = drain(&stores, args.batch, |id, claim| {
        if let Some(at) = enqueued.remove(&id) {
            waits.push(at.elapsed());
            last_claim = claim;
        }
        enqueued.is_empty()
    })
    .await;
    waits.sort();
    println!(
        "{backend}{} backlog {}: {total} small-group jobs claimed by claim {last_claim} of {claims}; \
         enqueue to claim p50 {:.1?} p99 {:.1?} max {:.1?}",
        if args.ungrouped { " ungrouped" } else { "" },
        args.backlog,
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        waits.last().copied().unwrap_or_default(),
    );
    if let Some(url) = &args.redis {
        // What is left of the backlog is deleted with the prefix's keys.
        let pool = palisade::store::redis::pool(url).unwrap();
        let mut conn = pool.get().await.unwrap();
        let keys: Vec<String> = deadpool_redis::redis::cmd("KEYS")
            .arg(format!("{{{prefix}}}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        for chunk in keys.chunks(1000) {
            let _: () = deadpool_redis::redis::cmd("DEL")
                .arg(chunk)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}
