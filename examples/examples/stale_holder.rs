//! The classic timeline, step by step, with the real tokens and outcomes: a lease holder
//! pauses past its expiry, a second worker takes over, the first wakes up and writes.
//!
//! `cargo run -p palisade-examples --example stale_holder`

use std::time::Duration;

use palisade::*;

const TTL: Duration = Duration::from_millis(300);

fn step(n: u32, text: impl std::fmt::Display) {
    println!("{n}. {text}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let coordinator = MemoryLeaseStore::new();
    let sink = MemoryFencedStore::new();
    let scope = Scope::new("account:42");

    // 40 earlier jobs already ran on this account, so the tokens read like the story.
    for _ in 0..40 {
        coordinator
            .enqueue(vec![NewJob::raw("noop", "null")
                .with_queue("history")
                .with_scope(scope.clone())])
            .await?;
        let c = coordinator
            .claim("history", "earlier", 1, TTL)
            .await?
            .remove(0);
        coordinator
            .settle(vec![(c.lease.id, Settlement::completed())])
            .await?;
    }
    coordinator
        .enqueue(vec![
            NewJob::raw("transfer", "null").with_scope(scope.clone())
        ])
        .await?;

    let a = coordinator
        .claim("default", "worker-A", 1, TTL)
        .await?
        .remove(0)
        .lease;
    step(
        1,
        format!(
            "A acquires the lease on {scope}: token {}, lease {}",
            a.token.counter(),
            a.id
        ),
    );

    let pause = TTL + Duration::from_millis(50);
    step(
        2,
        format!("A pauses (GC, SIGSTOP, VM suspend) for {pause:?}; its renewals stop with it"),
    );
    tokio::time::sleep(pause).await;
    let reaped = coordinator.reap(10).await?;
    step(
        3,
        format!(
            "A's lease expires; the reaper puts the job back ({} stalled)",
            reaped.len()
        ),
    );

    let b = coordinator
        .claim("default", "worker-B", 1, TTL)
        .await?
        .remove(0)
        .lease;
    step(
        4,
        format!("B acquires the lease: token {}", b.token.counter()),
    );

    let write = |lease: &Lease, value: &str| FencedWrite {
        scope: scope.clone(),
        fence: Fence {
            token: lease.token,
            lease: lease.id,
        },
        key: IdempotencyKey::new(format!("{}/balance", lease.token)),
        mutations: vec![Mutation::Set {
            key: "account:42:balance".into(),
            value: value.into(),
        }],
    };
    let by_b = sink.write(write(&b, "90 (B's transfer)")).await?;
    step(
        5,
        format!(
            "B writes balance = 90 with token {} -> {by_b:?}",
            b.token.counter()
        ),
    );

    step(
        6,
        "A resumes, unaware, and writes what it computed before the pause",
    );
    let by_a = sink.write(write(&a, "80 (A's stale transfer)")).await?;
    step(
        7,
        format!(
            "A writes balance = 80 with token {} -> {by_a:?}",
            a.token.counter()
        ),
    );
    let done_a = coordinator
        .settle(vec![(a.id, Settlement::completed())])
        .await?
        .remove(0);
    step(8, format!("A tries to complete the job -> {done_a:?}"));
    let done_b = coordinator
        .settle(vec![(b.id, Settlement::completed())])
        .await?
        .remove(0);
    step(9, format!("B completes the job -> {done_b:?}"));

    println!(
        "\nthe sink holds {:?}",
        sink.read("account:42:balance").await?
    );
    println!("without the token compare at the sink, step 7 would have overwritten B's write.");
    Ok(())
}
