//! `Client` is a plain tokio handle: it enqueues and counts from a runtime without any actix
//! `System`, against Redis (a private server) and against an embedded store.

use std::sync::Arc;
use std::time::Duration;

use palisade::{Client, Error, LeaseStore, MemoryLeaseStore, NewJob};
use palisade_testkit::RedisServer;

async fn exercise(client: &Client, store: Option<Arc<MemoryLeaseStore>>) {
    let one = client
        .enqueue(NewJob::raw("k", "1").with_scope("s"))
        .await
        .unwrap();
    let many = client
        .enqueue_many(vec![
            NewJob::raw("k", "2").with_scope("s"),
            NewJob::raw("k", "3").with_delay(Duration::from_secs(60)),
        ])
        .await
        .unwrap();
    assert_eq!(many.len(), 2);
    assert!(!many.contains(&one));
    let counts = client.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.waiting, counts.delayed), (1, 1, 1));
    let bad = client
        .enqueue_many(vec![NewJob::raw("k", "4"), NewJob::raw("", "5")])
        .await;
    assert!(matches!(bad, Err(Error::InvalidJob(_))), "{bad:?}");
    assert_eq!(
        client.counts("default").await.unwrap().pending(),
        3,
        "all or none"
    );
    assert!(client.dead("default", 10).await.unwrap().is_empty());
    if let Some(store) = store {
        let claimed = store
            .claim("default", "w", 10, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(claimed[0].job.id, one);
    }
}

#[tokio::test]
async fn client_enqueues_without_actix_on_redis() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url(), "producer").await.unwrap();
    exercise(&client, None).await;
}

#[tokio::test]
async fn client_enqueues_into_an_embedded_store() {
    let store = Arc::new(MemoryLeaseStore::new());
    exercise(&Client::new(store.clone()), Some(store)).await;
}

#[tokio::test]
async fn client_reports_unreachable_redis_as_retryable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = Client::connect(&format!("redis://127.0.0.1:{port}"), "p")
        .await
        .err()
        .unwrap();
    assert!(err.is_retryable(), "{err}");
}
