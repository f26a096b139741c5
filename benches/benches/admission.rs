//! Criterion benches of the pure admission rule and the in-memory stores' hot operations.
//!
//! `cargo bench -p palisade-benches --bench admission`

#![allow(missing_docs)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use palisade::*;

fn fence(token: u64, lease: LeaseId) -> Fence {
    Fence {
        token: FencingToken::from_u64(token),
        lease,
    }
}

fn admission(c: &mut Criterion) {
    let lease = LeaseId::new();
    c.bench_function("admit/advance_token", |b| {
        let mut scope = ScopeFence::default();
        let key = IdempotencyKey::new("k");
        let mut t = 0;
        b.iter(|| {
            t += 1;
            scope.admit(fence(t, lease), &key, FencingToken::ZERO)
        })
    });
    c.bench_function("admit/stale_rejection", |b| {
        let mut scope = ScopeFence::default();
        scope.admit(
            fence(100, lease),
            &IdempotencyKey::new("k"),
            FencingToken::ZERO,
        );
        let key = IdempotencyKey::new("j");
        b.iter(|| scope.admit(fence(99, LeaseId::new()), &key, FencingToken::ZERO))
    });
}

fn memory_stores(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    c.bench_function("memory_sink/write_hincr", |b| {
        let sink = MemoryFencedStore::new();
        let lease = LeaseId::new();
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            rt.block_on(sink.write(FencedWrite {
                scope: Scope::new("acct"),
                fence: fence(1, lease),
                key: IdempotencyKey::new(n.to_string()),
                mutations: vec![Mutation::HashIncr {
                    key: "acct".into(),
                    field: "b".into(),
                    by: 1,
                }],
            }))
            .unwrap()
        })
    });
    c.bench_function("memory_coordinator/enqueue_claim_complete_x100", |b| {
        b.iter_batched(
            MemoryLeaseStore::new,
            |store| {
                rt.block_on(async {
                    let jobs = (0..100).map(|_| NewJob::raw("noop", "null")).collect();
                    store.enqueue(jobs).await.unwrap();
                    let claims = store
                        .claim("default", "b", 100, Duration::from_secs(30))
                        .await
                        .unwrap();
                    let done = claims
                        .iter()
                        .map(|c| (c.lease.id, Settlement::completed()))
                        .collect();
                    store.settle(done).await.unwrap();
                })
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, admission, memory_stores);
criterion_main!(benches);
