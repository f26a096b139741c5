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

/// Issue 23: the reply of an enqueue is lost after the script ran (the proxy cuts it
/// half-way). The client retries with the ids it gave the jobs before the first attempt, and
/// each job is there once, under the id it returned. Minting ids per attempt adds them twice.
#[tokio::test]
async fn an_enqueue_whose_reply_is_lost_is_retried_as_the_same_jobs() {
    use palisade_testkit::FaultProxy;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port, 23);
    let client = Client::connect(&proxy.redis_url(), "lost").await.unwrap();
    // A reply carrying a job id (a 36-byte bulk string), not a PING's.
    proxy.cut_next_replies(1, b"$36\r\n");
    let one = client.enqueue(NewJob::raw("k", "1")).await.unwrap();
    proxy.cut_next_replies(1, b"$36\r\n");
    let many = client
        .enqueue_many(vec![
            NewJob::raw("k", "2").with_scope("s"),
            NewJob::raw("k", "3").with_delay(Duration::from_secs(60)),
        ])
        .await
        .unwrap();
    assert_eq!(proxy.stats().cut, 2, "both replies were cut");
    // The enqueue script counts every job it is given, added or not: each batch ran twice.
    let seq = server.cli(&["GET", "{lost}:seq"]).unwrap();
    assert_eq!(seq, "6", "each enqueue ran twice");
    let counts = client.counts("default").await.unwrap();
    assert_eq!(
        (counts.ready, counts.waiting, counts.delayed),
        (2, 0, 1),
        "{counts:?}"
    );
    let ready = server
        .cli(&["ZRANGE", "{lost}:q:default\tk", "0", "-1"])
        .unwrap();
    let mut ids: Vec<String> = ready.lines().map(str::to_owned).collect();
    ids.sort();
    let mut want = vec![one.to_string(), many[0].to_string()];
    want.sort();
    assert_eq!(ids, want, "the jobs go by the ids the client returned");
}

/// Found by the attack review of issue 23: a job whose own unique key lapses within the
/// retry window (`--unique-ttl 0s`) could be done and gone, key and all, before a retry: the
/// enqueue is not retried, and its failure says the outcome is unknown.
#[tokio::test]
async fn an_enqueue_that_cannot_be_retried_safely_says_its_outcome_is_unknown() {
    use palisade_testkit::FaultProxy;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port, 23);
    let client = Client::connect(&proxy.redis_url(), "short").await.unwrap();
    proxy.cut_next_replies(1, b"$36\r\n");
    let done = client
        .enqueue(NewJob::raw("k", "1").with_unique_key("k", Duration::ZERO))
        .await;
    assert!(matches!(done, Err(Error::OutcomeUnknown(_))), "{done:?}");
    assert_eq!(
        server.cli(&["GET", "{short}:seq"]).unwrap(),
        "1",
        "not retried"
    );
    assert_eq!(
        client.counts("default").await.unwrap().ready,
        1,
        "it was added"
    );
}

/// Issue 23, the `Coordinator` actor's path: its `Enqueue` retries a lost reply with the ids
/// it gave the jobs before the first attempt, like `Client` (both go through one function;
/// this pins that the actor does not mint its own).
#[actix::test]
async fn the_coordinator_actors_enqueue_whose_reply_is_lost_adds_each_job_once() {
    use actix::Actor as _;
    use palisade::{Coordinator, Enqueue, RedisLeaseStore};
    use palisade_testkit::FaultProxy;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port, 23);
    let pool = palisade::store::redis::pool(&proxy.redis_url()).unwrap();
    let store = Arc::new(RedisLeaseStore::new(pool, "actor"));
    let coordinator = Coordinator::new(store).start();
    proxy.cut_next_replies(1, b"$36\r\n");
    let ids = coordinator
        .send(Enqueue(vec![
            NewJob::raw("k", "1"),
            NewJob::raw("k", "2").with_scope("s"),
        ]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(proxy.stats().cut, 1, "the reply was cut");
    assert_eq!(
        server.cli(&["GET", "{actor}:seq"]).unwrap(),
        "4",
        "the batch ran twice"
    );
    let ready = server
        .cli(&["ZRANGE", "{actor}:q:default\tk", "0", "-1"])
        .unwrap();
    let mut got: Vec<String> = ready.lines().map(str::to_owned).collect();
    got.sort();
    let mut want: Vec<String> = ids.iter().map(ToString::to_string).collect();
    want.sort();
    assert_eq!(got, want, "each job once, under the id the actor returned");
}
