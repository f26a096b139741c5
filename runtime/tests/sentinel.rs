//! The Redis backends behind Redis Sentinel — a private master, its replica and three
//! sentinels, started here on free loopback ports and stopped by pid: a failover is followed
//! without a restart, moves the epoch, and refuses the old holder.

use std::time::Duration;

use palisade::*;
use palisade_testkit::RedisSentinels;

async fn start_group() -> RedisSentinels {
    tokio::task::spawn_blocking(RedisSentinels::start)
        .await
        .unwrap()
}

fn incr(claim: &Claim, idem: &str) -> FencedWrite {
    FencedWrite {
        scope: claim.lease.scope.clone(),
        fence: Fence {
            token: claim.lease.token,
            lease: claim.lease.id,
        },
        key: IdempotencyKey::new(idem),
        mutations: vec![Mutation::HashIncr {
            key: "acct:7:balance".into(),
            field: "cents".into(),
            by: 5,
        }],
    }
}

/// The master is killed (SIGKILL); the sentinels promote its replica, which has a new run
/// id, so the coordinator moves to a new epoch there. The old master then comes back on its
/// old address — empty, and demoted by the sentinels — so a client that kept its connections
/// or its address would write into a server that lost everything or refuses writes: the
/// store follows the sentinels instead. The job the dead master had leased is claimed again
/// under the new epoch; the old holder's write, renewal and settlement are refused; a job
/// enqueued with `WAIT` before the kill survives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_moves_the_epoch_and_refuses_the_old_holder() {
    let mut group = start_group().await;
    let ttl = Duration::from_millis(1500);
    let store =
        RedisLeaseStore::new(group.target(), "sn").with_durable_enqueue(1, Duration::from_secs(5));
    let sink = RedisFencedStore::new(group.target(), "ledger");
    store
        .enqueue_all(vec![
            NewJob::raw("transfer", "null").with_scope("acct:7"),
            NewJob::raw("later", "null"),
        ])
        .await
        .unwrap();
    let kinds = ["transfer".to_string()];
    let first = store
        .claim_kinds("default", &kinds, "A", 1, ttl)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(
        sink.write(incr(&first, "a1")).await.unwrap(),
        Admission::Applied
    );
    // The claim's writes (the epoch record among them) reach the replica before the kill: a
    // WAIT-ed enqueue after them confirms it (replication is one ordered stream).
    store
        .enqueue_all(vec![NewJob::raw("marker", "null")])
        .await
        .unwrap();
    let old = group.master();
    tokio::task::block_in_place(|| group.fail_over());
    assert_ne!(group.master(), old, "the sentinels named the same master");

    palisade_testkit::failover::the_old_holder_is_refused(&store, &sink, &first, incr, ttl).await;
    // Everything above went to the new master: the demoted one holds nothing of it.
    let demoted = &group.nodes[old];
    assert!(
        demoted
            .cli(&["ROLE"])
            .is_some_and(|r| r.starts_with("slave")),
        "the old master was not demoted"
    );
}

/// A store behind sentinels none of which answers fails with `Unavailable` within seconds,
/// naming the sentinels (and no password), instead of hanging.
#[tokio::test]
async fn unreachable_sentinels_are_a_quick_clear_error() {
    let ports = palisade_testkit::free_ports::<2>();
    let url = format!(
        "redis+sentinel://:s3cret@127.0.0.1:{},127.0.0.1:{}/nobody",
        ports[0], ports[1]
    );
    let target: store::redis::Target = store::redis::sentinel(&url, None).unwrap().into();
    let started = std::time::Instant::now();
    let err = store::redis::ping(target).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("sentinel") && !msg.contains("s3cret"), "{msg}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}
