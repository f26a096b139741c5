//! The operator's controls on a queue — pause and resume, a fleet-wide rate limit, a
//! per-kind concurrency cap, cancelling a job — on the embedded coordinator (against Redis
//! the same calls, or `palisade pause|resume|limit|cap|cancel`).
//!
//! `cargo run -p palisade-examples --example queue_controls`

use std::{sync::Arc, time::Duration};

use palisade::*;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let store = Arc::new(MemoryLeaseStore::new());
    let client = Client::new(store.clone());
    let jobs = |n| {
        (0..n)
            .map(|_| NewJob::raw("mail", "null"))
            .collect::<Vec<_>>()
    };
    client.enqueue_many(jobs(10)).await?;
    let ttl = Duration::from_secs(30);

    // Paused: nothing is handed out, nothing is lost.
    store.set_paused("default", true).await?;
    assert!(store.claim("default", "w", 10, ttl).await?.is_empty());
    store.set_paused("default", false).await?;

    // At most 3 per second across every worker (the first claim takes the full bucket).
    let limit = RateLimit {
        jobs: 3,
        per: Duration::from_secs(1),
    };
    store.set_rate_limit("default", Some(limit)).await?;
    let first = store.claim("default", "w", 10, ttl).await?;
    println!("rate limit 3/s: claimed {}", first.len());
    store.set_rate_limit("default", None).await?;

    // At most 2 `mail` jobs running at once across the fleet (3 run already: capped from now).
    store.set_concurrency_cap("mail", Some(2)).await?;
    let more = store.claim("default", "w", 10, ttl).await?;
    println!("cap 2: claimed {} more", more.len());

    // Cancel one running job (its lease is revoked) and one still queued.
    let running = more[0].job.id;
    let queued = client.enqueue(NewJob::raw("mail", "null")).await?;
    println!("cancel running: {:?}", client.cancel(running).await?);
    println!("cancel queued:  {:?}", client.cancel(queued).await?);
    let counts = client.counts("default").await?;
    println!(
        "ready {}, leased {}, dead {}",
        counts.ready, counts.leased, counts.dead
    );
    assert_eq!(counts.dead, 2);
    Ok(())
}
