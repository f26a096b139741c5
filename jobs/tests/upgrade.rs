//! Issue 55: `palisade upgrade plan | check | finalize` against a real worker process and a
//! private Redis, and what a worker does while the installation's format level is one its
//! build cannot read (a later release finalized it): every acting call refused before any
//! change, nothing lost, and back to work once the level is one it reads.

use std::process::Command;
use std::time::Duration;

use palisade_testkit::{wait_for, Process, RedisServer};

/// This tree's binary.
const BIN: &str = env!("CARGO_BIN_EXE_palisade");

fn run(redis: &RedisServer, args: &[&str]) -> String {
    palisade_testkit::process::run(BIN, &redis.url(), args)
}

/// Runs a command expected to fail; its stdout and stderr.
fn fails(redis: &RedisServer, args: &[&str]) -> (String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("PALISADE_REDIS_URL", redis.url())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!out.status.success(), "{args:?} succeeded:\n{stdout}");
    (stdout, stderr)
}

fn balance(redis: &RedisServer) -> Option<String> {
    redis.cli(&["HGET", "palisade-ledger:d:account:1", "balance"])
}

#[test]
fn upgrade_plans_checks_and_finalizes_and_a_worker_waits_out_a_level_it_cannot_read() {
    let redis = RedisServer::start();
    let url = redis.url();
    let worker = Process::worker(BIN, &["--redis", &url, "--concurrency", "2"], "warn");
    wait_for("the worker's heartbeat", Duration::from_secs(20), || {
        run(&redis, &["upgrade", "plan"]).contains("live worker processes: 1")
    });
    let plan = run(&redis, &["upgrade", "plan"]);
    assert!(
        plan.contains("format level 1 (never recorded: release 0.1.0's format)"),
        "{plan}"
    );
    assert!(plan.contains("reads and writes format levels 1"), "{plan}");
    assert!(
        plan.contains(&format!("(pid {}), palisade ", worker.pid())),
        "{plan}"
    );
    run(&redis, &["upgrade", "check"]);
    // A mistyped prefix is no installation: check fails, finalize creates nothing.
    let (_, err) = fails(&redis, &["upgrade", "check", "--prefix", "palisdae"]);
    assert!(err.contains("check --prefix"), "{err}");
    fails(&redis, &["upgrade", "finalize", "--prefix", "palisdae"]);
    assert_eq!(redis.cli(&["KEYS", "{palisdae}*"]).as_deref(), Some(""));

    // A worker of a later release that reads only level 2 (as its heartbeat says): check
    // names it, and finalize is refused, recording nothing.
    let now: u64 = redis
        .cli(&["TIME"])
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let beat = serde_json::json!({
        "worker": "later-1", "host": "elsewhere", "pid": 4242, "version": "0.3.0",
        "queues": ["default"], "concurrency": 1, "running": 0, "started_ms": 0,
        "formats": [2, 2], "a_field_of_0_3": true
    });
    let record = format!("{}\t{beat}", now * 1000);
    redis.cli(&["HSET", "{palisade}:workers", "later-1", &record]);
    let until = ((now + 600) * 1000).to_string();
    redis.cli(&["ZADD", "{palisade}:workers:seen", &until, "later-1"]);
    let (out, err) = fails(&redis, &["upgrade", "check"]);
    assert!(
        out.contains("later-1 on elsewhere (pid 4242), palisade 0.3.0: levels 2..=2  <- outside"),
        "{out}"
    );
    assert!(
        err.contains("1 live worker process(es) outside the window"),
        "{err}"
    );
    let (_, err) = fails(&redis, &["upgrade", "finalize"]);
    assert!(err.contains("later-1 on elsewhere"), "{err}");
    assert_eq!(
        redis.cli(&["EXISTS", "{palisade}:format"]).as_deref(),
        Some("0")
    );
    redis.cli(&["HDEL", "{palisade}:workers", "later-1"]);
    redis.cli(&["ZREM", "{palisade}:workers:seen", "later-1"]);

    // Finalized at this build's level: recorded, once.
    let said = run(&redis, &["upgrade", "finalize"]);
    assert!(said.contains("format level 1 recorded"), "{said}");
    let said = run(&redis, &["upgrade", "finalize"]);
    assert!(said.contains("already at format level 1"), "{said}");
    assert_eq!(
        redis.cli(&["GET", "{palisade}:format"]).as_deref(),
        Some("1")
    );

    // Work goes through at level 1.
    let deposit = r#"{"account":1,"cents":5}"#;
    run(&redis, &["enqueue", "ledger.deposit", deposit]);
    wait_for("the first deposit", Duration::from_secs(20), || {
        balance(&redis).as_deref() == Some("5")
    });

    // A later release finalized level 2. This build refuses, before any change: a producer,
    // a new worker, and the running worker's claims; `plan` still reads, `check` fails.
    redis.cli(&["SET", "{palisade}:format", "2"]);
    let (_, err) = fails(&redis, &["enqueue", "ledger.deposit", deposit]);
    assert!(err.contains("PALISADE_FORMAT"), "{err}");
    let mut late = Process::spawn(BIN, &["worker", "--redis", &url], "warn");
    wait_for(
        "the late worker to give up",
        Duration::from_secs(20),
        || late.try_wait().is_some(),
    );
    assert!(!late.try_wait().unwrap().success());
    let (out, _) = fails(&redis, &["upgrade", "check"]);
    assert!(
        out.contains("this binary cannot run against level 2"),
        "{out}"
    );
    // A job a later-level producer enqueued is not touched by this build's worker.
    redis.cli(&["SET", "{palisade}:format", "1"]);
    run(&redis, &["enqueue", "ledger.deposit", deposit]);
    redis.cli(&["SET", "{palisade}:format", "2"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(balance(&redis).as_deref(), Some("5"), "claimed at level 2");
    let status = run(&redis, &["upgrade", "plan"]);
    assert!(status.contains("format level 2"), "{status}");

    // Back at a level it reads (in a test; a real level is never lowered), the running
    // worker carries on: nothing was lost while it was refused.
    redis.cli(&["SET", "{palisade}:format", "1"]);
    wait_for("the second deposit", Duration::from_secs(20), || {
        balance(&redis).as_deref() == Some("10")
    });
    assert!(worker.counter("palisade_backend_errors_total", &[]) > 0);
}
