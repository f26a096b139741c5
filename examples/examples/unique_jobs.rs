//! Idempotent enqueue: a producer that retries (a webhook delivered twice, a user who
//! double-clicks) adds one job, not two.
//!
//! `cargo run -p palisade-examples --example unique_jobs`

use std::{sync::Arc, time::Duration};

use palisade::*;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Against Redis: `Client::connect("redis://127.0.0.1:6379", "palisade").await?`.
    let client = Client::new(Arc::new(MemoryLeaseStore::new()));
    let send = || {
        NewJob::raw("invoice.send", r#"{"invoice":"INV-7"}"#)
            // Held while the job is queued or running, and for an hour after it was enqueued.
            .with_unique_key("invoice:INV-7", Duration::from_secs(3600))
    };
    let first = client.enqueue_unique(send()).await?;
    let second = client.enqueue_unique(send()).await?;
    println!("first:  {first:?}\nsecond: {second:?}");
    assert!(matches!(first, Enqueued::Added(_)));
    assert_eq!(second, Enqueued::Existing(first.id()));
    assert_eq!(client.counts("default").await?.ready, 1);
    Ok(())
}
