//! The actors over the Redis backends, in real time on private redis-servers: the same
//! worker code that runs embedded runs against Redis unchanged.

mod common;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use common::{RedisCluster, RedisServer};
use palisade::*;
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
    let store = RedisLeaseStore::new(coordinator, "actors");
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

async fn wait_settled(coordinator: &Addr<Coordinator>) -> QueueCounts {
    for _ in 0..3000 {
        let counts = coordinator
            .send(CountJobs("default".into()))
            .await
            .unwrap()
            .unwrap();
        if counts.pending() == 0 {
            return counts;
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
        .settle(vec![(a_lease.id, Settlement::Complete)])
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

async fn many_deposits_apply_exactly_once(s: Setup) {
    let registry = Registry::new().register(
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
    );
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
    let mut expected = [0i64; 8];
    let jobs: Vec<NewJob> = (0..400)
        .map(|i| {
            let (account, cents) = (i % 8, (i as i64 % 7) + 1);
            expected[account as usize] += cents;
            NewJob::new("deposit", &(account, cents))
                .unwrap()
                .with_scope(format!("account:{account}"))
        })
        .collect();
    s.coordinator.send(Enqueue(jobs)).await.unwrap().unwrap();
    assert_eq!(wait_settled(&s.coordinator).await.completed, 400);
    for (account, want) in expected.iter().enumerate() {
        let Some(Value::Hash(h)) = s
            .sink
            .read(&format!("{{account:{account}}}"))
            .await
            .unwrap()
        else {
            panic!("account {account} missing");
        };
        assert_eq!(h["balance"], want.to_string(), "account {account}");
    }
}
