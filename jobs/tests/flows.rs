//! Issue 25's acceptance: a flow of 1,000 parts whose results a `total` step adds up, run by
//! three real `palisade worker` processes while one is SIGSTOPped past its lease, one is
//! kill -9'd and replaced, and the coordinator's Redis is restarted from its append-only
//! file. The total is exact, the callback's fenced effect applied once, nothing pending or
//! dead.

use std::time::Duration;

use palisade::{Client, FlowState, StepEnd};
use palisade_testkit::{wait_for, Process, RedisCluster, RedisServer};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

fn worker(redis: &RedisServer, sink: &RedisServer, name: &str) -> Process {
    worker_on(&redis.url(), &sink.url(), name, &[])
}

fn worker_on(redis: &str, sink: &str, name: &str, extra: &[&str]) -> Process {
    let ledger = format!("ledger={sink}");
    let mut args = vec!["--redis", redis, "--sink", &ledger, "--name", name];
    args.extend(["--lease", "2s", "--concurrency", "8", "--arbiters", "1"]);
    args.extend(extra);
    Process::worker(BIN, &args, "warn")
}

/// Checks a finished report flow of `parts` parts (`extra` more steps: the total, the callback,
/// a split): every step completed, the total exact in the result and in the fenced ledger,
/// the callback's effect applied once, nothing pending or dead.
fn check_report(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    flow: &palisade::Flow,
    (parts, extra): (i64, usize),
    ledger: impl Fn(&str, &str) -> Option<String>,
) {
    // (Right after a restart or a failover a pooled connection may still be the old one: its
    // first use fails as retryable, and the next finds the server.)
    fn again<T>(mut read: impl FnMut() -> palisade::Result<T>) -> T {
        for _ in 0..20 {
            match read() {
                Err(e) if e.is_retryable() => std::thread::sleep(Duration::from_millis(200)),
                done => return done.unwrap(),
            }
        }
        read().unwrap()
    }
    let id = flow.id();
    let done = again(|| rt.block_on(client.flow(id))).unwrap();
    let missed: Vec<_> = done
        .ended
        .iter()
        .filter(|(_, e)| **e != StepEnd::Completed)
        .collect();
    assert_eq!(done.state, FlowState::Succeeded, "{missed:?}");
    assert_eq!(done.count(StepEnd::Completed), parts as usize + extra);
    let expected = parts * (parts + 1) / 2;
    let total: Option<i64> = again(|| rt.block_on(client.result(flow.job_id("total"))));
    assert_eq!(total, Some(expected));
    let key = format!("palisade-ledger:d:{}", palisade_jobs::report_key(id));
    assert_eq!(ledger(&key, "total"), Some(expected.to_string()));
    assert_eq!(
        ledger(&key, "announced").as_deref(),
        Some("1"),
        "the callback's effect applied once"
    );
    let counts = again(|| rt.block_on(client.counts("default")));
    assert_eq!((counts.pending(), counts.dead), (0, 0), "{counts:?}");
}

/// The three runs of a report through failures take their turns: each runs several worker
/// processes and private Redis servers, and on two cores, side by side, they would starve a
/// Sentinel group's health checks into failovers the test did not ask for.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// A runtime and a client of the coordinator at `target` with `partitions` partitions.
fn client_on(
    target: palisade::store::redis::Target,
    partitions: usize,
) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(async {
            let generation =
                palisade::store::redis::check_layout(target.clone(), "palisade", partitions)
                    .await?;
            palisade::store::redis::coordinator(
                target,
                "palisade",
                partitions,
                generation,
                palisade::DEFAULT_MAX_PAYLOAD_BYTES,
                |s| s,
            )
            .map(Client::new)
        })
        .unwrap();
    (rt, client)
}

#[test]
fn a_thousand_part_report_adds_up_through_a_pause_a_kill_and_a_redis_restart() {
    let _turn = one_at_a_time();
    let mut redis = RedisServer::start_with_aof();
    let sink = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let a = worker(&redis, &sink, "A");
    let b = worker(&redis, &sink, "B");
    let c = worker(&redis, &sink, "C");
    let flow = palisade_jobs::report_flow(1000, 120);
    let client = rt
        .block_on(Client::connect(&redis.url(), "palisade"))
        .unwrap();
    let id = rt.block_on(client.create_flow(&flow)).unwrap();
    let status = || rt.block_on(client.flow(id)).ok().flatten();
    let ended = || status().map_or(0, |s| s.ended.len());

    wait_for("100 parts", Duration::from_secs(60), || ended() >= 100);
    // A paused for 2.5 leases: its parts are reaped and run elsewhere; when it wakes, its
    // completions are refused and keep no end.
    a.signal("-STOP");
    std::thread::sleep(Duration::from_secs(5));
    a.signal("-CONT");
    wait_for("400 parts", Duration::from_secs(60), || ended() >= 400);
    b.signal("-KILL");
    let b2 = worker(&redis, &sink, "B2");
    wait_for("600 parts", Duration::from_secs(60), || ended() >= 600);
    redis.restart();
    wait_for("the flow to finish", Duration::from_secs(180), || {
        status().is_some_and(|s| s.state != FlowState::Running)
    });

    check_report(&rt, &client, &flow, (1000, 2), |key, field| {
        sink.cli(&["HGET", key, field])
    });
    let shown = palisade_testkit::process::run(
        BIN,
        &redis.url(),
        &["flow", "show", &id.to_string(), "--json"],
    );
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["state"], "succeeded", "{shown}");
    let list = shown["step_list"].as_array().unwrap();
    assert!(
        !list.is_empty() && list.iter().all(|s| s["state"]["ended"] == "completed"),
        "{shown}"
    );
    let recorded: u64 = [&a, &c, &b2]
        .iter()
        .map(|w| w.counter("palisade_flow_steps_total", &[("end", "completed")]))
        .sum();
    let released: u64 = [&a, &c, &b2]
        .iter()
        .map(|w| w.counter("palisade_flow_releases_total", &[("action", "run")]))
        .sum();
    let timed: u64 = [&a, &c, &b2]
        .iter()
        .map(|w| w.counter("palisade_flow_release_seconds_count", &[]))
        .sum();
    // (B's share died with it; a pass may record a step again after a restart.)
    assert!(recorded >= 500 && released >= 2, "{recorded} {released}");
    assert!(timed >= 1, "no release latency was recorded");
    assert!(
        a.counter("palisade_settlements_refused_total", &[]) > 0,
        "the paused worker held parts past its lease"
    );
    for w in [a, c, b2] {
        w.terminate_cleanly();
    }
}

/// The report fanned out by a handler (`report.split` adds the 1,000 parts to the flow with
/// its completion) on a 3-master Redis Cluster with 3 partitions: the parts spread over the
/// partitions' slots, the flow kept at its home in one of them; one worker SIGSTOPped past
/// its lease, one kill -9'd and replaced, and the whole cluster restarted from its
/// append-only files. (No failover here: a master that dies loses the writes its replica had
/// not received, and a flow's home and its parts are on different masters — see
/// docs/jobs.md.)
#[test]
fn the_fanned_out_report_adds_up_on_a_three_master_cluster_with_partitions() {
    let _turn = one_at_a_time();
    let mut cluster = RedisCluster::start_with_aof();
    let nodes = cluster.urls().join(",");
    // (`--redis-cluster` takes the ledger to the cluster too.)
    let cluster_args = ["--redis-cluster", "--partitions", "3"];
    let a = worker_on(&nodes, &nodes, "A", &cluster_args);
    let b = worker_on(&nodes, &nodes, "B", &cluster_args);
    let c = worker_on(&nodes, &nodes, "C", &cluster_args);
    let (rt, client) = client_on(cluster.target(), 3);
    let flow = palisade_jobs::report_fanout_flow(1000, 120);
    let id = rt.block_on(client.create_flow(&flow)).unwrap();
    let ended = || {
        rt.block_on(client.flow(id))
            .ok()
            .flatten()
            .map_or(0, |s| s.ended.len())
    };
    wait_for("100 parts", Duration::from_secs(60), || ended() >= 100);
    a.signal("-STOP");
    std::thread::sleep(Duration::from_secs(5));
    a.signal("-CONT");
    wait_for("400 parts", Duration::from_secs(60), || ended() >= 400);
    b.signal("-KILL");
    let b2 = worker_on(&nodes, &nodes, "B2", &cluster_args);
    wait_for("600 parts", Duration::from_secs(60), || ended() >= 600);
    cluster.restart();
    wait_for("the flow to finish", Duration::from_secs(180), || {
        rt.block_on(client.flow(id))
            .ok()
            .flatten()
            .is_some_and(|s| s.state != FlowState::Running)
    });
    let port = cluster.nodes[0].port.to_string();
    check_report(&rt, &client, &flow, (1000, 3), |key, field| {
        let out = std::process::Command::new("redis-cli")
            .args(["-c", "-p", &port, "HGET", key, field])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (!text.is_empty()).then_some(text)
    });
    assert!(a.counter("palisade_settlements_refused_total", &[]) > 0);
    for w in [a, c, b2] {
        w.terminate_cleanly();
    }
}

/// Scope 2's coordinator failover: the fanned-out report on one Redis behind Sentinel, whose
/// master is killed (SIGKILL) mid-flow and its replica promoted. Replication is one ordered
/// stream, so the promoted replica holds a prefix of the master's writes: a settlement, step
/// end or release it lost is lost with everything after it, and is done again — a lost
/// completion's part is reaped and run again under a new epoch, the total's and the
/// callback's fenced writes are keyed by job — so the total is exact and the callback's
/// effect applied once. (Across masters there is no such prefix: see the cluster test.)
#[test]
fn the_fanned_out_report_adds_up_through_a_sentinel_failover() {
    let _turn = one_at_a_time();
    let mut group = palisade_testkit::RedisSentinels::start();
    let sink = RedisServer::start();
    let url = group.url();
    let a = worker_on(&url, &sink.url(), "A", &[]);
    let b = worker_on(&url, &sink.url(), "B", &[]);
    let (rt, client) = client_on(group.target(), 1);
    let flow = palisade_jobs::report_fanout_flow(300, 100);
    let id = rt.block_on(client.create_flow(&flow)).unwrap();
    let ended = || {
        rt.block_on(client.flow(id))
            .ok()
            .flatten()
            .map_or(0, |s| s.ended.len())
    };
    wait_for("100 parts", Duration::from_secs(60), || ended() >= 100);
    // (Waits until the replica was promoted and the old master rejoined, empty, as a replica.)
    group.fail_over();
    let finished = palisade_testkit::net::poll_until(Duration::from_secs(180), || {
        rt.block_on(client.flow(id))
            .ok()
            .flatten()
            .is_some_and(|s| s.state != FlowState::Running)
    });
    // (If it does not, what is left and what the workers said: a stuck step is named.)
    assert!(
        finished,
        "the flow did not finish: {:?}\ncounts {:?}\nA:\n{}\nB:\n{}",
        rt.block_on(client.flow(id)),
        rt.block_on(client.counts("default")),
        a.log_tail(),
        b.log_tail()
    );
    check_report(&rt, &client, &flow, (300, 3), |key, field| {
        sink.cli(&["HGET", key, field])
    });
    for w in [a, b] {
        w.terminate_cleanly();
    }
}

/// `palisade flow cancel` stops a running flow: its running parts' leases are revoked, the
/// rest never run; `flow show` says cancelled.
#[test]
fn the_cli_shows_and_cancels_a_flow() {
    let (redis, sink) = (RedisServer::start(), RedisServer::start());
    let w = worker(&redis, &sink, "A");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(Client::connect(&redis.url(), "palisade"))
        .unwrap();
    let flow = palisade_jobs::report_flow(20, 60_000);
    let id = rt.block_on(client.create_flow(&flow)).unwrap().to_string();
    let palisade = |args: &[&str]| palisade_testkit::process::run(BIN, &redis.url(), args);
    wait_for("parts to run", Duration::from_secs(20), || {
        rt.block_on(client.counts("default")).unwrap().leased == 8
    });
    let shown = palisade(&["flow", "show", &id]);
    assert!(shown.contains("running; 22 steps, 20 released"), "{shown}");
    // Each step in run order: the 20 parts released, the two after them waiting.
    let rows: Vec<&str> = shown.lines().skip(1).collect();
    assert_eq!(rows.len(), 22, "{shown}");
    assert!(
        rows[..20].iter().all(|r| r.contains(": released")),
        "{shown}"
    );
    assert!(
        rows[20..].iter().all(|r| r.contains(": waiting after")),
        "{shown}"
    );
    // The sampler (one per fleet; this worker holds its role) counts it every 5 s.
    wait_for("the running flows gauge", Duration::from_secs(20), || {
        w.counter("palisade_flows_running", &[]) == 1
    });
    let status = palisade(&["status"]);
    assert!(
        status.contains("flows running: 1 (oldest first)")
            && status.contains(&format!("  {id}  22 steps: 0 completed")),
        "{status}"
    );
    let said = palisade(&["flow", "cancel", &id]);
    assert!(said.contains("cancelled: 22 jobs stopped"), "{said}");
    wait_for("the flow to end cancelled", Duration::from_secs(20), || {
        palisade(&["flow", "show", &id])
            .contains("cancelled; 22 steps, 22 released, 0 completed, 22 dead")
    });
    let counts = rt.block_on(client.counts("default")).unwrap();
    assert_eq!((counts.pending(), counts.dead), (0, 22), "{counts:?}");
    let status: serde_json::Value = serde_json::from_str(&palisade(&["status", "--json"])).unwrap();
    assert_eq!(status["flows"]["running"], 0, "{status}");
    w.terminate_cleanly();
}
