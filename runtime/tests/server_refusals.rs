//! A Redis sink write the server refuses for itself (over maxmemory, a demoted master) fails
//! retryably whatever its mutations, and a demoted master's connection is dropped: the fast
//! path of `fenced_write.lua` (a single hash mutation tried first) must not turn the server's
//! refusal into a permanent error, which a handler's `?` would dead-letter. Found by an attack
//! review of that change. Each test runs on its own private redis-server.

use std::sync::Arc;

use palisade::*;
use palisade_testkit::suite::{fence, set, write};
use palisade_testkit::RedisServer;

fn incr(key: &str) -> Vec<Mutation> {
    vec![Mutation::HashIncr {
        key: key.into(),
        field: "n".into(),
        by: 1,
    }]
}

fn hset(key: &str) -> Vec<Mutation> {
    vec![Mutation::HashSet {
        key: key.into(),
        fields: vec![("f".into(), "v".into())],
    }]
}

/// What each write got, for the assertion message.
fn describe(r: &Result<Admission>) -> String {
    match r {
        Ok(a) => format!("Ok({a:?})"),
        // `JobError::from(e)` (a handler's `?`): retryable -> Retry, else Fatal.
        Err(e) => format!(
            "Err({e:?}) -> {}",
            if e.is_retryable() {
                "JobError::Retry"
            } else {
                "JobError::Fatal (dead-lettered at once)"
            }
        ),
    }
}

/// Runs the three writes on a server already put into a refusing state, each under a
/// fresh scope so ownership always passes.
async fn refused_writes(
    server: &RedisServer,
    sink: &Arc<RedisFencedStore>,
) -> Vec<(String, Result<Admission>)> {
    let lease = LeaseId::new();
    let mut out = Vec::new();
    for (i, (what, m)) in [
        ("single HashIncr", incr("h1")),
        ("single HashSet", hset("h2")),
        ("Set (control: the checked path)", set("s1", "v")),
    ]
    .into_iter()
    .enumerate()
    {
        let r = sink
            .write(write(
                &format!("scope{i}"),
                fence(7, lease),
                &format!("k{i}"),
                m,
            ))
            .await;
        // The sink's connection (the only client that ran a script) after this write.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let open = server
            .cli(&["CLIENT", "LIST"])
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("cmd=evalsha") || l.contains("cmd=eval "))
            .count();
        out.push((
            format!("{what} [script connections open after it: {open}]"),
            r,
        ));
    }
    out
}

/// A private server and a sink on it that has written once (its script loaded, its
/// connection open).
async fn warm_sink(prefix: &str) -> (RedisServer, Arc<RedisFencedStore>) {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let sink = Arc::new(RedisFencedStore::new(pool, prefix));
    let lease = LeaseId::new();
    assert_eq!(
        sink.write(write("warm", fence(1, lease), "w", set("warm", "1")))
            .await
            .unwrap(),
        Admission::Applied
    );
    (server, sink)
}

fn assert_all_retryable(results: &[(String, Result<Admission>)]) {
    let report: Vec<String> = results
        .iter()
        .map(|(what, r)| format!("{what}: {}", describe(r)))
        .collect();
    for (what, r) in results {
        assert!(
            matches!(r, Err(e) if e.is_retryable()),
            "{what} should fail retryably like every other write refused by the server; got\n  {}",
            report.join("\n  ")
        );
    }
}

/// Redis over maxmemory (noeviction): the first write command of a script is refused with
/// OOM; every write fails retryably.
#[tokio::test]
async fn writes_refused_for_memory_fail_retryably() {
    let (server, sink) = warm_sink("oom").await;
    assert_eq!(
        server.cli(&["CONFIG", "SET", "maxmemory", "1"]).as_deref(),
        Some("OK")
    );
    let results = refused_writes(&server, &sink).await;
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_all_retryable(&results);
}

/// The server became a replica (a demoted master: REPLICAOF by an operator or a failover
/// tool that does not kill clients): every write fails with READONLY, retryably, and the
/// link drops its connection to the read-only server after each.
#[tokio::test]
async fn writes_to_a_demoted_master_fail_retryably_and_drop_the_connection() {
    let (server, sink) = warm_sink("ro").await;
    // A master nobody listens on: the server turns read-only at once and keeps its data.
    let dead = palisade_testkit::free_port().to_string();
    assert_eq!(
        server.cli(&["REPLICAOF", "127.0.0.1", &dead]).as_deref(),
        Some("OK")
    );
    let results = refused_writes(&server, &sink).await;
    server.cli(&["REPLICAOF", "NO", "ONE"]);
    assert_all_retryable(&results);
    for (what, _) in &results {
        assert!(
            what.ends_with("open after it: 0]"),
            "the link keeps its connection to a read-only server: {what}"
        );
    }
}
