//! The actors over the Redis backends, in real time on private redis-servers: the same
//! worker code that runs embedded runs against Redis unchanged.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use palisade::*;
use palisade_testkit::{RedisCluster, RedisServer};
use tokio::sync::{mpsc, Notify};

const TTL: Duration = Duration::from_millis(600);

struct Setup {
    /// The private servers or cluster, stopped when the test ends.
    _redis: Box<dyn std::any::Any>,
    coordinator: Addr<Coordinator>,
    store: RedisLeaseStore,
    sink: RedisFencedStore,
    sinks: Sinks,
}

/// The coordinator and the sink on two private servers.
fn setup() -> Setup {
    let (coordinator_redis, sink_redis) = (RedisServer::start(), RedisServer::start());
    let coordinator = store::redis::pool(&coordinator_redis.url()).unwrap();
    let sink = store::redis::pool(&sink_redis.url()).unwrap();
    setup_on(
        coordinator.into(),
        sink.into(),
        Box::new((coordinator_redis, sink_redis)),
    )
}

/// The coordinator and the sink on one private Redis Cluster (3 masters, 3 replicas).
async fn setup_on_a_cluster() -> Setup {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    setup_on(cluster.target(), cluster.target(), Box::new(cluster))
}

fn setup_on(
    coordinator: store::redis::Target,
    sink: store::redis::Target,
    redis: Box<dyn std::any::Any>,
) -> Setup {
    setup_with(RedisLeaseStore::new(coordinator, "actors"), sink, redis)
}

fn setup_with(
    store: RedisLeaseStore,
    sink: store::redis::Target,
    redis: Box<dyn std::any::Any>,
) -> Setup {
    let coordinator = Coordinator::new(Arc::new(store.clone()))
        .with_reap_interval(Duration::from_millis(50))
        .start();
    let sink = RedisFencedStore::new(sink, "ledger");
    let sinks = Sinks::new().with(
        "ledger",
        FencedSink::new("ledger", Arc::new(sink.clone())).start(),
    );
    Setup {
        _redis: redis,
        coordinator,
        store,
        sink,
        sinks,
    }
}

fn config(name: &str) -> WorkerConfig {
    WorkerConfig {
        lease_ttl: TTL,
        poll_interval: Duration::from_millis(10),
        ..WorkerConfig::new(name)
    }
}

/// Waits until no job is pending (30 s at most); a count that fails (Redis failing over) is
/// asked again.
async fn wait_settled(coordinator: &Addr<Coordinator>) -> QueueCounts {
    for _ in 0..3000 {
        let counts = coordinator.send(CountJobs("default".into())).await.unwrap();
        if let Ok(counts) = counts {
            if counts.pending() == 0 {
                return counts;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("jobs never settled");
}

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("no report in 30s")
        .unwrap()
}

#[actix::test]
async fn stale_holder_is_refused_by_the_redis_sink_and_coordinator() {
    stale_holder_is_refused(setup()).await;
}

#[actix::test]
async fn stale_holder_is_refused_on_a_redis_cluster() {
    stale_holder_is_refused(setup_on_a_cluster().await).await;
}

/// Worker A takes a job and pauses past its lease; B takes the job over and writes; A wakes
/// and writes: the sink refuses it, and the coordinator refuses A's settlement.
async fn stale_holder_is_refused(s: Setup) {
    let (tx, mut seen) = mpsc::unbounded_channel::<(&str, Lease, Option<Admission>)>();
    let gate = Arc::new(Notify::new());
    let registry = |who: &'static str, gate: Option<Arc<Notify>>| {
        let tx = tx.clone();
        Registry::new().register("transfer", move |ctx: JobContext, _: ()| {
            let (tx, gate) = (tx.clone(), gate.clone());
            async move {
                let lease = ctx.lease().clone();
                if let Some(gate) = gate {
                    tx.send((who, lease.clone(), None)).unwrap();
                    gate.notified().await; // paused; not looking at cancellation
                }
                // In the scope's hash tag, so it shares the scope's slot on a cluster.
                let write = vec![Mutation::Set {
                    key: "{account:42}:balance".into(),
                    value: who.into(),
                }];
                let admission = ctx.sink("ledger")?.write(write).await?;
                tx.send((who, lease, Some(admission.clone()))).unwrap();
                admission.accepted()?;
                Ok(())
            }
        })
    };
    let a = Worker::new(
        config("A"),
        s.coordinator.clone(),
        registry("A", Some(gate.clone())),
        s.sinks.clone(),
    )
    .unwrap()
    .start();
    s.coordinator
        .send(Enqueue(vec![
            NewJob::raw("transfer", "null").with_scope("account:42")
        ]))
        .await
        .unwrap()
        .unwrap();
    let (_, a_lease, _) = next(&mut seen).await;
    a.send(Freeze(true)).await.unwrap();
    let _b = Worker::new(
        config("B"),
        s.coordinator.clone(),
        registry("B", None),
        s.sinks.clone(),
    )
    .unwrap()
    .start();
    let (who, b_lease, admission) = next(&mut seen).await;
    assert_eq!((who, admission), ("B", Some(Admission::Applied)));
    assert!(b_lease.token > a_lease.token);
    assert_eq!(wait_settled(&s.coordinator).await.completed, 1);

    a.send(Freeze(false)).await.unwrap();
    gate.notify_one();
    let (who, _, admission) = next(&mut seen).await;
    assert_eq!(who, "A");
    // Refused against the sink's fence (B's token) or, once B's settlement has published
    // the low watermark past it, against the watermark: either way at or above B's token.
    match admission {
        Some(Admission::Rejected(Rejection::StaleToken { presented, highest })) => {
            assert_eq!(presented, a_lease.token);
            assert!(highest >= b_lease.token, "{highest:?}");
        }
        other => panic!("A's late write was not refused: {other:?}"),
    }
    let refused = s
        .store
        .settle(vec![(a_lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(matches!(refused[..], [Err(Error::LeaseNotCurrent(_))]));
    tokio::time::sleep(TTL).await;
    let counts = s
        .coordinator
        .send(CountJobs("default".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        counts,
        QueueCounts {
            completed: 1,
            // Enqueued once; stalled once (A's lease expired while it was paused).
            enqueued: 1,
            stalled: 1,
            ..QueueCounts::default()
        }
    );
    assert_eq!(
        s.sink.read("{account:42}:balance").await.unwrap(),
        Some(Value::Text("B".into()))
    );
}

#[actix::test]
async fn many_deposits_through_two_workers_apply_exactly_once() {
    many_deposits_apply_exactly_once(setup()).await;
}

#[actix::test]
async fn many_deposits_apply_exactly_once_on_a_redis_cluster() {
    many_deposits_apply_exactly_once(setup_on_a_cluster().await).await;
}

/// Deposits run through two workers while the coordinator's master is SIGKILLed mid-run (the
/// sink on a server of its own): the replica takes over, claims and settlements fail until it
/// has, and the run carries on in a new epoch. Every deposit (enqueued with `WAIT`) completes
/// and is applied exactly once: a job whose settlement died with the master runs again and
/// its write is recognised as a duplicate.
#[actix::test]
async fn deposits_survive_a_failover_of_the_coordinators_master_mid_run() {
    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let sink_redis = RedisServer::start();
    let store = RedisLeaseStore::new(cluster.target(), "live")
        .with_durable_enqueue(1, Duration::from_secs(5));
    let before = store.epoch().await.unwrap();
    let master = cluster.master_of("{live}:epoch");
    let sink = store::redis::pool(&sink_redis.url()).unwrap();
    let s = setup_with(store.clone(), sink.into(), Box::new(sink_redis));
    start_workers(&s, &deposit_registry());
    let (jobs, expected) = deposits(600);
    for chunk in jobs.chunks(50) {
        s.coordinator
            .send(Enqueue(chunk.to_vec()))
            .await
            .unwrap()
            .unwrap();
    }
    // Kill the master once a third is done, with most of the run still to go.
    let at_kill = loop {
        let done = s
            .coordinator
            .send(CountJobs("default".into()))
            .await
            .unwrap();
        match done {
            Ok(c) if c.completed >= 200 => break c,
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    assert!(
        at_kill.pending() > 100,
        "the run was nearly over: {at_kill:?}"
    );
    // (The test runs on one thread: the killing and waiting go to a blocking thread.)
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.fail_over(master);
        cluster
    })
    .await
    .unwrap();
    let counts = wait_settled(&s.coordinator).await;
    assert_eq!((counts.completed, counts.dead), (600, 0), "{counts:?}");
    assert!(
        store.epoch().await.unwrap() > before,
        "the failover did not move the epoch"
    );
    check_balances(&s.sink, &expected).await;
    drop(cluster);
}

/// Two workers, w1 and w2, with `registry`.
fn start_workers(s: &Setup, registry: &Registry) {
    for name in ["w1", "w2"] {
        Worker::new(
            config(name),
            s.coordinator.clone(),
            registry.clone(),
            s.sinks.clone(),
        )
        .unwrap()
        .start();
    }
}

fn deposit_registry() -> Registry {
    Registry::new().register(
        "deposit",
        |ctx: JobContext, (account, cents): (u32, i64)| async move {
            let credit = Mutation::HashIncr {
                key: format!("{{account:{account}}}"),
                field: "balance".into(),
                by: cents,
            };
            ctx.sink("ledger")?.write(vec![credit]).await?.accepted()?;
            Ok(())
        },
    )
}

/// `n` deposits over 8 accounts (each account its own scope), and each account's total.
fn deposits(n: usize) -> (Vec<NewJob>, [i64; 8]) {
    let mut expected = [0i64; 8];
    let jobs = (0..n)
        .map(|i| {
            let (account, cents) = (i % 8, (i as i64 % 7) + 1);
            expected[account] += cents;
            NewJob::new("deposit", &(account as u32, cents))
                .unwrap()
                .with_scope(format!("account:{account}"))
        })
        .collect();
    (jobs, expected)
}

async fn check_balances(sink: &RedisFencedStore, expected: &[i64; 8]) {
    for (account, want) in expected.iter().enumerate() {
        let Some(Value::Hash(h)) = sink.read(&format!("{{account:{account}}}")).await.unwrap()
        else {
            panic!("account {account} missing");
        };
        assert_eq!(h["balance"], want.to_string(), "account {account}");
    }
}

async fn many_deposits_apply_exactly_once(s: Setup) {
    start_workers(&s, &deposit_registry());
    let (jobs, expected) = deposits(400);
    s.coordinator.send(Enqueue(jobs)).await.unwrap().unwrap();
    assert_eq!(wait_settled(&s.coordinator).await.completed, 400);
    check_balances(&s.sink, &expected).await;
}
