//! Issue 25's acceptance: a flow of 1,000 parts whose results a `total` step adds up, run by
//! three real `palisade worker` processes while one is SIGSTOPped past its lease, one is
//! kill -9'd and replaced, and the coordinator's Redis is restarted from its append-only
//! file. The total is exact, the callback's fenced effect applied once, nothing pending or
//! dead.

use std::time::Duration;

use palisade::{Client, FlowState, StepEnd};
use palisade_testkit::{wait_for, Process, RedisServer};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

fn worker(redis: &RedisServer, sink: &RedisServer, name: &str) -> Process {
    let ledger = format!("ledger={}", sink.url());
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--sink",
        &ledger,
        "--name",
        name,
        "--lease",
        "2s",
        "--concurrency",
        "8",
        "--arbiters",
        "1",
    ];
    Process::worker(BIN, &args, "warn")
}

#[test]
fn a_thousand_part_report_adds_up_through_a_pause_a_kill_and_a_redis_restart() {
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

    let done = status().unwrap();
    assert_eq!(
        done.state,
        FlowState::Succeeded,
        "{:?}",
        done.ended
            .values()
            .filter(|e| **e != StepEnd::Completed)
            .count()
    );
    assert_eq!(done.count(StepEnd::Completed), 1002);
    let total: Option<i64> = rt.block_on(client.result(flow.job_id("total"))).unwrap();
    assert_eq!(total, Some(500_500));
    let key = format!("palisade-ledger:d:{}", palisade_jobs::report_key(id));
    assert_eq!(
        sink.cli(&["HGET", &key, "total"]).as_deref(),
        Some("500500")
    );
    assert_eq!(
        sink.cli(&["HGET", &key, "announced"]).as_deref(),
        Some("1"),
        "the callback's effect applied once"
    );
    let counts = rt.block_on(client.counts("default")).unwrap();
    assert_eq!((counts.pending(), counts.dead), (0, 0), "{counts:?}");
    assert!(
        a.counter("palisade_settlements_refused_total", &[]) > 0,
        "the paused worker held parts past its lease"
    );
    for w in [a, c, b2] {
        assert!(w.terminate().success());
    }
}
