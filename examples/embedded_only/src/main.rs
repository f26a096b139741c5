//! The memory-only build runs the embedded path: 200 deposits over 10 accounts on two workers
//! and a memory sink, a stale holder's write refused, every balance exact. Exit 0 only then.
//!
//! `.ci/run` runs it with `cargo run -p embedded-only`, alone, so the `palisade` it links is
//! built with no feature (a workspace-wide build would merge in the test kit's).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use palisade::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Deposit {
    account: u32,
    cents: i64,
}

async fn deposit(ctx: JobContext, d: Deposit) -> Result<(), JobError> {
    let credit = Mutation::HashIncr {
        key: format!("account:{}", d.account),
        field: "balance".into(),
        by: d.cents,
    };
    ctx.sink("ledger")?.write(vec![credit]).await?.accepted()?;
    Ok(())
}

fn main() -> ExitCode {
    match System::new().block_on(run()) {
        Ok(()) => {
            println!("embedded-only: every balance exact, the stale write refused");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("embedded-only: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryLeaseStore::new());
    let coordinator = Coordinator::new(store.clone()).start();
    let ledger = Arc::new(MemoryFencedStore::new());
    let sinks = Sinks::new().with("ledger", FencedSink::new("ledger", ledger.clone()).start());
    let registry = Registry::new().register("deposit", deposit);
    for name in ["w1", "w2"] {
        Worker::new(
            WorkerConfig::new(name),
            coordinator.clone(),
            registry.clone(),
            sinks.clone(),
        )?
        .start();
    }
    let mut jobs = Vec::new();
    for i in 0..200u32 {
        let d = Deposit {
            account: i % 10,
            cents: i64::from(i),
        };
        jobs.push(NewJob::new("deposit", &d)?.with_scope(format!("account:{}", i % 10)));
    }
    coordinator.send(Enqueue(jobs)).await??;
    while coordinator
        .send(CountJobs("default".into()))
        .await??
        .pending()
        > 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for account in 0..10u32 {
        let want: i64 = (0..200i64).filter(|i| i % 10 == i64::from(account)).sum();
        let got = match ledger.read(&format!("account:{account}")).await? {
            Some(Value::Hash(h)) => h.get("balance").and_then(|b| b.parse().ok()),
            _ => None,
        };
        if got != Some(want) {
            return Err(format!("account {account}: {got:?}, expected {want}").into());
        }
    }
    // A holder whose lease was taken over writes with its old token: refused.
    store
        .enqueue(vec![NewJob::raw("deposit", "null").with_scope("account:0")])
        .await?;
    let old = store
        .claim("default", "paused", 1, Duration::from_millis(1))
        .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    store.reap(10).await?;
    let new = store
        .claim("default", "successor", 1, Duration::from_secs(30))
        .await?;
    let (old, new) = (&old[0].lease, &new[0].lease);
    let write = |lease: &Lease, key: &str| FencedWrite {
        scope: lease.scope.clone(),
        fence: Fence {
            token: lease.token,
            lease: lease.id,
        },
        key: IdempotencyKey::new(key),
        mutations: vec![Mutation::Set {
            key: "last".into(),
            value: key.into(),
        }],
    };
    if !matches!(ledger.write(write(new, "new")).await?, Admission::Applied) {
        return Err("the successor's write was not applied".into());
    }
    match ledger.write(write(old, "old")).await? {
        Admission::Rejected(Rejection::StaleToken { .. }) => Ok(()),
        other => Err(format!("the stale holder's write was {other:?}").into()),
    }
}
