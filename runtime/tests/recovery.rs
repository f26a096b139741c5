//! Invariant 7 — tokens stay monotonic across coordinator loss — forced for real: the
//! coordinator's private redis-server is restarted (with AOF, and empty), flushed, loses its
//! counter key, or has its counter pushed back, while the fenced sink lives on in a *different*
//! private redis-server. Each scenario runs with and without a durable epoch source.
//!
//! After every disruption: no token is ever applied for two leases, and each scope's next
//! applied token is above everything the sink accepted before — at once with a durable source
//! (where the loss is detectable), after at most one rejected attempt per scope without.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use palisade::*;
use palisade_testkit::RedisServer;

const TTL: Duration = Duration::from_secs(30);
const SCOPES: [&str; 3] = ["account:1", "account:2", "account:3"];

struct World {
    coordinator_redis: RedisServer,
    _sink_redis: RedisServer,
    store: RedisLeaseStore,
    sink: RedisFencedStore,
    /// Newest token the sink accepted, per scope.
    accepted: HashMap<&'static str, FencingToken>,
    /// Every applied write's token and lease, across the whole run.
    owners: HashMap<FencingToken, LeaseId>,
    epoch_dir: Option<std::path::PathBuf>,
}

/// Where the coordinator's epochs survive a Redis data loss, if anywhere.
#[derive(Clone, Copy, PartialEq)]
enum Durable {
    Nowhere,
    File,
    Postgres,
}

impl World {
    async fn new(coordinator_redis: RedisServer, durable: Durable) -> Self {
        let sink_redis = RedisServer::start();
        let pool = palisade::store::redis::pool(&coordinator_redis.url()).unwrap();
        let mut store = RedisLeaseStore::new(pool, "recovery");
        let epoch_dir = (durable == Durable::File).then(|| {
            std::env::temp_dir().join(format!("palisade-epochs-{}", uuid::Uuid::new_v4()))
        });
        if let Some(dir) = &epoch_dir {
            store = store.with_epoch_source(Arc::new(FileEpochSource::new(dir.join("epoch"))));
        }
        if durable == Durable::Postgres {
            let url = std::env::var("PALISADE_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            let name = format!("recovery-{}", uuid::Uuid::new_v4());
            let source = PostgresEpochSource::connect(&url, &name)
                .await
                .expect("PostgreSQL is running (.ci/run starts it)");
            store = store.with_epoch_source(Arc::new(source));
        }
        let sink_pool = palisade::store::redis::pool(&sink_redis.url()).unwrap();
        Self {
            coordinator_redis,
            _sink_redis: sink_redis,
            store,
            sink: RedisFencedStore::new(sink_pool, "ledger"),
            accepted: HashMap::new(),
            owners: HashMap::new(),
            epoch_dir,
        }
    }

    /// Retries an operation while the restarted server's stale pooled connections fail.
    async fn claim_one(&self) -> Claim {
        for _ in 0..100 {
            match self.store.claim("default", "recovery", 1, TTL).await {
                Ok(mut claims) if !claims.is_empty() => return claims.remove(0),
                Ok(_) => panic!("nothing to claim"),
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("claim failed: {e}"),
            }
        }
        panic!("coordinator never came back");
    }

    async fn enqueue(&self, scope: &str) {
        for _ in 0..100 {
            match self
                .store
                .enqueue(vec![NewJob::raw("deposit", "null").with_scope(scope)])
                .await
            {
                Ok(_) => return,
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("enqueue failed: {e}"),
            }
        }
        panic!("coordinator never came back");
    }

    /// One job per scope, each run until its write is applied; returns rejected attempts per
    /// scope.
    async fn round(&mut self) -> Vec<usize> {
        let mut rejections = Vec::new();
        for scope in SCOPES {
            self.enqueue(scope).await;
            let mut rejected = 0;
            loop {
                let claim = self.claim_one().await;
                let write = FencedWrite {
                    scope: Scope::new(scope),
                    fence: Fence {
                        token: claim.lease.token,
                        lease: claim.lease.id,
                    },
                    key: IdempotencyKey::new(format!("{}/credit", claim.job.id)),
                    mutations: vec![Mutation::HashIncr {
                        key: scope.into(),
                        field: "balance".into(),
                        by: 1,
                    }],
                };
                match self.sink.write(write).await.unwrap() {
                    Admission::Applied => {
                        let token = claim.lease.token;
                        if let Some(before) = self.accepted.get(scope) {
                            assert!(
                                token > *before,
                                "{scope}: applied {token:?} after {before:?}"
                            );
                        }
                        let owner = *self.owners.entry(token).or_insert(claim.lease.id);
                        assert_eq!(
                            owner, claim.lease.id,
                            "token {token:?} applied for two leases"
                        );
                        self.accepted.insert(scope, token);
                        let settled = self
                            .store
                            .settle(vec![(claim.lease.id, Settlement::completed())])
                            .await
                            .unwrap();
                        assert!(settled[0].is_ok());
                        break;
                    }
                    Admission::Duplicate => panic!("a fresh write cannot be a duplicate"),
                    Admission::Rejected(rejection) => {
                        rejected += 1;
                        assert!(rejected <= 1, "{scope}: rejected twice: {rejection}");
                        // The coordinator still believes this lease current: it must accept
                        // the fenced settlement and reseed above the sink.
                        let settled = self
                            .store
                            .settle(vec![(
                                claim.lease.id,
                                Settlement::Fenced {
                                    highest: rejection.highest().unwrap(),
                                    reason: rejection.to_string(),
                                },
                            )])
                            .await
                            .unwrap();
                        assert!(settled[0].is_ok(), "{:?}", settled[0]);
                    }
                }
            }
            rejections.push(rejected);
        }
        rejections
    }

    async fn balances_are_exact(&self, rounds: i64) {
        for scope in SCOPES {
            let Some(Value::Hash(h)) = self.sink.read(scope).await.unwrap() else {
                panic!("{scope} missing in the sink");
            };
            assert_eq!(h["balance"], rounds.to_string(), "{scope}");
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(dir) = &self.epoch_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs a round, disrupts, runs two more rounds, and checks the outcome.
async fn scenario(
    server: RedisServer,
    durable: Durable,
    disrupt: impl FnOnce(&mut RedisServer),
    detectable: bool,
) {
    let mut world = World::new(server, durable).await;
    assert_eq!(
        world.round().await,
        [0, 0, 0],
        "first round on a fresh Redis"
    );
    let old_epoch = world.accepted.values().map(|t| t.epoch()).max().unwrap();
    disrupt(&mut world.coordinator_redis);
    let after = world.round().await;
    for (scope, token) in &world.accepted {
        assert!(
            token.epoch() > old_epoch,
            "{scope}: {token:?} is not in an epoch above {old_epoch}"
        );
    }
    if durable != Durable::Nowhere && detectable {
        assert_eq!(
            after,
            [0, 0, 0],
            "a durable epoch source recovers without a rejected write"
        );
    } else {
        assert!(after.iter().all(|r| *r <= 1), "{after:?}");
    }
    assert_eq!(world.round().await, [0, 0, 0], "recovered for good");
    world.balances_are_exact(3).await;
}

fn flush_all(server: &mut RedisServer) {
    assert_eq!(server.cli(&["FLUSHALL"]).as_deref(), Some("OK"));
}

fn delete_counter(server: &mut RedisServer) {
    assert_eq!(
        server.cli(&["DEL", "{recovery}:counter"]).as_deref(),
        Some("1")
    );
}

/// Test hook: the counter goes back to zero behind the coordinator's back (as a lost AOF tail
/// or a failover to a lagging replica would do) without any trace Redis could notice.
fn regress_counter(server: &mut RedisServer) {
    assert_eq!(
        server.cli(&["SET", "{recovery}:counter", "0"]).as_deref(),
        Some("OK")
    );
}

macro_rules! recovery_tests {
    ($($name:ident: $server:expr, $disrupt:expr, $detectable:expr;)*) => {
        mod with_epoch_file {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    scenario($server, Durable::File, $disrupt, $detectable).await;
                }
            )*
        }
        mod with_epoch_row_in_postgres {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    scenario($server, Durable::Postgres, $disrupt, $detectable).await;
                }
            )*
        }
        mod without_durable_epoch_source {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    scenario($server, Durable::Nowhere, $disrupt, $detectable).await;
                }
            )*
        }
    };
}

recovery_tests! {
    restart_with_aof: RedisServer::start_with_aof(), RedisServer::restart, true;
    restart_empty: RedisServer::start(), RedisServer::restart_empty, true;
    flushall: RedisServer::start(), flush_all, true;
    counter_key_deleted: RedisServer::start(), delete_counter, true;
    counter_regression: RedisServer::start(), regress_counter, false;
}

/// The sink layer alone, no coordinator help: after Redis restarts empty and without a durable
/// source, the same token value is granted again — and the sink refuses the second lease.
#[tokio::test]
async fn regranted_token_is_a_token_conflict_not_a_second_writer() {
    let mut world = World::new(RedisServer::start(), Durable::Nowhere).await;
    world.round().await;
    let first = world.accepted[SCOPES[0]];
    world.coordinator_redis.restart_empty();
    world.enqueue(SCOPES[0]).await;
    let claim = world.claim_one().await;
    assert_eq!(
        claim.lease.token, first,
        "an empty Redis without a durable source regrants the same value"
    );
    let admission = world
        .sink
        .write(FencedWrite {
            scope: Scope::new(SCOPES[0]),
            fence: Fence {
                token: claim.lease.token,
                lease: claim.lease.id,
            },
            key: IdempotencyKey::new("k"),
            mutations: vec![],
        })
        .await
        .unwrap();
    assert!(
        matches!(admission, Admission::Rejected(Rejection::TokenConflict { token, .. }) if token == first),
        "{admission:?}"
    );
}
