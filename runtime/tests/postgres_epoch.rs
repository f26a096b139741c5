//! The Postgres epoch source against the real PostgreSQL on 127.0.0.1:5432 (database from
//! `PALISADE_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`), each test
//! under its own row name.

use std::collections::HashSet;

use palisade::{EpochSource, PostgresEpochSource};
use palisade_testkit::postgres_url;

async fn source() -> PostgresEpochSource {
    let name = format!("test-{}", uuid::Uuid::new_v4());
    PostgresEpochSource::connect(&postgres_url(), &name)
        .await
        .expect("PostgreSQL is running (.ci/run starts it)")
}

#[tokio::test]
async fn epochs_only_grow_and_honour_the_floor() {
    let source = source().await;
    assert_eq!(source.next_epoch(0).await.unwrap(), 1);
    assert_eq!(source.next_epoch(0).await.unwrap(), 2);
    assert_eq!(source.next_epoch(40).await.unwrap(), 40);
    assert_eq!(source.next_epoch(3).await.unwrap(), 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hosts_never_share_an_epoch() {
    let name = format!("test-{}", uuid::Uuid::new_v4());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        // A separate connection pool per "host".
        let source = PostgresEpochSource::connect(&postgres_url(), &name)
            .await
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..5 {
                got.push(source.next_epoch(0).await.unwrap());
            }
            got
        }));
    }
    let mut all = HashSet::new();
    for t in tasks {
        for epoch in t.await.unwrap() {
            assert!(all.insert(epoch), "epoch {epoch} handed out twice");
        }
    }
    assert_eq!(all.len(), 40);
    assert_eq!(all.iter().max(), Some(&40));
}

#[tokio::test]
async fn bad_url_and_unreachable_server_are_clear_errors() {
    let bad = PostgresEpochSource::connect("not a url at all", "x")
        .await
        .err()
        .unwrap();
    assert!(bad.to_string().contains("invalid Postgres URL"), "{bad}");
    let down = PostgresEpochSource::connect("postgres://postgres@127.0.0.1:1/test", "x")
        .await
        .err()
        .unwrap();
    assert!(
        down.is_retryable() && down.to_string().contains("postgres"),
        "{down}"
    );
}
