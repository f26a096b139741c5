//! Issue 55: a rolling deploy as teams run one. Worker processes of the previous release
//! (the commit in `release/previous`, built by `.ci/previous-release`) and of this tree run
//! side by side on one coordinator Redis and one sink Redis, and each release's operator
//! commands act on what the other wrote. Old workers are SIGSTOPped past their lease and
//! kill -9'd, and new ones reap them; a host is rolled forward and another rolled back; the
//! scheduler role moves between releases. Balances are exact, no stale write is applied,
//! nothing is lost or left behind, every tick fires once. Mid-deploy `upgrade check` passes
//! (the old workers' heartbeats carry no window: read as level 1) and `upgrade finalize`
//! records level 1 while the flow still runs on both releases. Not here yet: Postgres sinks
//! and migrations (jobs/tests/outbox.rs runs an older schema's reader alone), and a level
//! above 1 (none exists: jobs/tests/upgrade.rs sets one by hand against this build).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use palisade::{Client, FlowState, StepEnd};
use palisade_testkit::{wait_for, Process, RedisServer};
use serde_json::Value;

/// This tree's binary.
const NEW: &str = env!("CARGO_BIN_EXE_palisade");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The previous release's binary, built on first use (minutes on a fresh machine; `.ci/run`
/// builds it in a step of its own first). Failing to build it fails the test: a mixed fleet
/// not tested is not a pass.
fn previous() -> String {
    let out = Command::new("bash")
        .arg(repo().join(".ci/previous-release"))
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "building the previous release failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(PathBuf::from(&path).is_file(), "{path} is no binary");
    // Not this tree under another name: the previous release is another commit.
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo())
        .output()
        .expect("git runs");
    let head = String::from_utf8(head.stdout).unwrap();
    assert!(
        !head.trim().is_empty() && !path.ends_with(head.trim()),
        "release/previous names the commit under test ({head})"
    );
    path
}

/// A worker of `bin` on `redis` with a `ledger` sink on `sink`, killed when dropped.
fn worker(bin: &str, redis: &RedisServer, sink: &RedisServer, name: &str) -> Process {
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
        "1s",
        "--concurrency",
        "8",
        "--arbiters",
        "1",
    ];
    Process::worker(bin, &args, "warn")
}

fn run(bin: &str, redis: &RedisServer, args: &[&str]) -> String {
    palisade_testkit::process::run(bin, &redis.url(), args)
}

fn counts(bin: &str, redis: &RedisServer) -> Value {
    let status: Value =
        serde_json::from_str(&run(bin, redis, &["status", "--json", "--scope", "-"])).unwrap();
    status["queues"]["default"].clone()
}

fn balance(sink: &RedisServer, account: u32) -> i64 {
    sink.cli(&[
        "HGET",
        &format!("palisade-ledger:d:account:{account}"),
        "balance",
    ])
    .and_then(|v| v.parse().ok())
    .unwrap_or(0)
}

/// Enqueues deposits `from..to` (job i deposits i + 1 cents to account i % accounts) through
/// `bin`'s `enqueue --stdin`, adding each to `expected`.
fn enqueue_deposits(
    bin: &str,
    redis: &RedisServer,
    (from, to): (u32, u32),
    accounts: u32,
    expected: &mut [i64],
) {
    let input: String = (from..to)
        .map(|i| {
            let (account, cents) = (i % accounts, i64::from(i) + 1);
            expected[account as usize] += cents;
            let hold = if i % 10 == 0 { 300 } else { 20 };
            format!("{{\"account\":{account},\"cents\":{cents},\"hold_ms\":{hold}}}\n")
        })
        .collect();
    let args = [
        "enqueue",
        "ledger.deposit",
        "--stdin",
        "--scope",
        "account:{account}",
        "--max-attempts",
        "20",
        "--max-stalls",
        "20",
    ];
    palisade_testkit::process::run_with_stdin(bin, &redis.url(), &args, &input);
}

/// The pid of the worker holding the scheduler role (`<pid>/<uuid>` in the role's key).
fn scheduler_pid(redis: &RedisServer) -> Option<String> {
    let holder = redis.cli(&["GET", "{palisade}:role:scheduler"])?;
    holder.split('/').next().map(str::to_owned)
}

fn client(redis: &RedisServer) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(async {
            palisade::store::redis::coordinator(
                palisade::store::redis::pool(&redis.url())?,
                "palisade",
                1,
                0,
                palisade::DEFAULT_MAX_PAYLOAD_BYTES,
                |s| s,
            )
            .map(Client::new)
        })
        .unwrap();
    (rt, client)
}

#[test]
fn deposits_a_flow_and_ticks_come_out_exact_across_two_releases() {
    let old = previous();
    let (redis, sink) = (RedisServer::start(), RedisServer::start());
    // A schedule kept by the old release's command, fired by whichever process holds the
    // scheduler role.
    run(
        &old,
        &redis,
        &[
            "schedule",
            "add",
            "tick",
            "* * * * * *",
            "email.send",
            r#"{"to":"ops@example.com","millis":5}"#,
        ],
    );
    let mut workers = vec![
        worker(&old, &redis, &sink, "old-a"),
        worker(&old, &redis, &sink, "old-b"),
        worker(NEW, &redis, &sink, "new-c"),
        worker(NEW, &redis, &sink, "new-d"),
    ];
    // Which of `workers` run the previous release, and the jobs completed by workers gone
    // since (read just before each went), [new, old].
    let mut old_ones = vec![true, true, false, false];
    let mut gone = [0u64; 2];
    let completions =
        |w: &Process| w.counter("palisade_jobs_finished_total", &[("outcome", "completed")]);
    let started = Instant::now();
    // Deposits from both releases' producers, and a fanned-out report flow (its split step
    // adds 200 parts with its completion) from this tree's client.
    let accounts = 10;
    let mut expected = vec![0i64; accounts as usize];
    enqueue_deposits(&old, &redis, (0, 300), accounts, &mut expected);
    enqueue_deposits(NEW, &redis, (300, 600), accounts, &mut expected);
    // A capped group's jobs, enqueued by the old release's command, capped by the new one's.
    let emails: String = (0..60)
        .map(|i| format!("{{\"to\":\"t{i}@example.com\",\"millis\":150}}\n"))
        .collect();
    let args = [
        "enqueue",
        "email.send",
        "--stdin",
        "--group",
        "tenant:1",
        "--max-stalls",
        "20",
    ];
    palisade_testkit::process::run_with_stdin(&old, &redis.url(), &args, &emails);
    run(NEW, &redis, &["group", "tenant:1", "--cap", "2"]);
    let (rt, client) = client(&redis);
    let flow = palisade_jobs::report_fanout_flow(200, 20);
    let id = rt.block_on(client.create_flow(&flow)).unwrap();
    let completed = || counts(NEW, &redis)["completed"].as_u64().unwrap_or(0);
    wait_for("100 jobs", Duration::from_secs(60), || completed() >= 100);

    // An old worker paused past its lease: new and old workers take its jobs over; woken,
    // its writes and settlements are refused.
    workers[0].signal("-STOP");
    std::thread::sleep(Duration::from_secs(4));
    workers[0].signal("-CONT");
    wait_for("250 jobs", Duration::from_secs(60), || completed() >= 250);
    // An old worker killed mid-job, its host rolled forward to this release.
    gone[1] += completions(&workers[1]);
    workers[1].signal("-KILL");
    workers[1] = worker(NEW, &redis, &sink, "new-b");
    old_ones[1] = false;
    // A new worker drained and its host rolled back to the previous release.
    let rolled_back = std::mem::replace(&mut workers[3], worker(&old, &redis, &sink, "old-d"));
    old_ones[3] = true;
    gone[0] += completions(&rolled_back);
    rolled_back.terminate_cleanly();
    // The scheduler's holder killed, whichever release it runs.
    wait_for("450 jobs", Duration::from_secs(60), || completed() >= 450);
    // Mid-deploy, both releases live: the window holds, and level 1 is finalized (recorded)
    // while the flow goes on.
    let check = run(NEW, &redis, &["upgrade", "check"]);
    assert!(
        check.contains("every live worker process reads levels 1 to 1"),
        "{check}"
    );
    let said = run(NEW, &redis, &["upgrade", "finalize"]);
    assert!(said.contains("format level 1 recorded"), "{said}");
    // (The role may still name a worker killed above until its lease lapses.)
    let mut holder = None;
    wait_for(
        "a live worker to hold the scheduler role",
        Duration::from_secs(15),
        || {
            let pid = scheduler_pid(&redis);
            holder = workers.iter().position(|w| Some(w.pid()) == pid);
            holder.is_some()
        },
    );
    let i = holder.unwrap();
    // Replaced by the other release's worker: the role moves across releases.
    let replacement = if old_ones[i] { NEW } else { old.as_str() };
    gone[old_ones[i] as usize] += completions(&workers[i]);
    workers[i].signal("-KILL");
    workers[i] = worker(replacement, &redis, &sink, "scheduler-replaced");
    old_ones[i] = !old_ones[i];

    wait_for("the flow to finish", Duration::from_secs(120), || {
        rt.block_on(client.flow(id))
            .ok()
            .flatten()
            .is_some_and(|s| s.state != FlowState::Running)
    });
    while started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    run(NEW, &redis, &["schedule", "remove", "tick"]);
    wait_for("every job to finish", Duration::from_secs(120), || {
        let c = counts(NEW, &redis);
        c["ready"] == 0 && c["leased"] == 0 && c["waiting"] == 0 && c["delayed"] == 0
    });

    // Exact balances: nothing lost, nothing applied twice, no stale write applied.
    for account in 0..accounts {
        assert_eq!(
            balance(&sink, account),
            expected[account as usize],
            "account {account}"
        );
    }
    // The flow: every step completed, the total exact, its callback applied once.
    let done = rt.block_on(client.flow(id)).unwrap().unwrap();
    assert_eq!(done.state, FlowState::Succeeded);
    assert_eq!(done.count(StepEnd::Completed), 200 + 3);
    let total: Option<i64> = rt.block_on(client.result(flow.job_id("total"))).unwrap();
    assert_eq!(total, Some(200 * 201 / 2));
    let key = format!("palisade-ledger:d:{}", palisade_jobs::report_key(id));
    let field = |f: &str| sink.cli(&["HGET", &key, f]);
    assert_eq!(field("total"), Some((200 * 201 / 2).to_string()));
    assert_eq!(field("announced").as_deref(), Some("1"));
    // Every tick fired once: one unique key a second, contiguous, and one job each.
    let keys = redis
        .cli(&["KEYS", "{palisade}:unique:schedule:tick:*"])
        .unwrap_or_default();
    let mut ticks: Vec<i64> = keys
        .lines()
        .filter_map(|k| k.rsplit(':').next()?.parse().ok())
        .collect();
    ticks.sort();
    assert!(ticks.len() >= 20, "{} ticks fired", ticks.len());
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1000,
            "a tick is missing after {}",
            pair[0]
        );
    }
    // Workers of both releases did work of their own (the fleet was mixed).
    let done_by = |old_release: bool| -> u64 {
        (workers.iter().zip(&old_ones))
            .filter(|(_, o)| **o == old_release)
            .map(|(w, _)| completions(w))
            .sum::<u64>()
            + gone[old_release as usize]
    };
    let (by_old, by_new) = (done_by(true), done_by(false));
    assert!(
        by_old > 0 && by_new > 0,
        "jobs completed by old workers {by_old}, by new ones {by_new}"
    );
    // Both releases' readers agree on the counts, and nothing is dead or pending.
    let (c_new, c_old) = (counts(NEW, &redis), counts(&old, &redis));
    assert_eq!(c_new["completed"], c_old["completed"]);
    assert_eq!(c_new["dead"], 0, "{c_new}");
    let jobs = 600 + 60 + (200 + 3) + ticks.len() as u64;
    assert_eq!(c_new["completed"].as_u64(), Some(jobs), "{c_new}");
    // Every slot of the capped group given back, as both releases read it.
    for bin in [NEW, old.as_str()] {
        let said = run(bin, &redis, &["group", "tenant:1"]);
        assert!(said.contains("0 ready, 0 running (cap 2)"), "{said}");
    }
    // Nothing kept for later: no follow-up record, step end or held job left behind.
    for key in ["{palisade}:thens", "{palisade}:stepends", "{palisade}:held"] {
        assert_eq!(redis.cli(&["ZCARD", key]).as_deref(), Some("0"), "{key}");
    }

    // The deploy finished: every process runs this release. The next deploy brings records
    // of a later format; this release's sweep and flow pass meet them (counted) and leave
    // them where they are for the processes that read them.
    drop(workers);
    let workers = [
        worker(NEW, &redis, &sink, "new-1"),
        worker(NEW, &redis, &sink, "new-2"),
    ];
    let later = [palisade::JobId::new(), palisade::JobId::new()];
    for parent in &later {
        let record = r#"{"v":2,"jobs":[],"waits":[{"name":"approval"}]}"#;
        redis.cli(&["SET", &format!("{{palisade}}:then:{parent}"), record]);
        redis.cli(&["ZADD", "{palisade}:thens", "0", &parent.to_string()]);
    }
    let step_end = format!("{}\tcharge\tsuspended", palisade::FlowId::new());
    let ended = palisade::JobId::new().to_string();
    redis.cli(&["HSET", "{palisade}:stepend", &ended, &step_end]);
    redis.cli(&["ZADD", "{palisade}:stepends", "0", &ended]);
    let met = |kind: &str| -> u64 {
        let label = [("kind", kind)];
        let counter = "palisade_records_unreadable_total";
        workers.iter().map(|w| w.counter(counter, &label)).sum()
    };
    wait_for(
        "the passes to meet the records",
        Duration::from_secs(30),
        || met("follow_ups") >= 4 && met("step_ends") >= 2,
    );
    for parent in &later {
        let kept = redis.cli(&["GET", &format!("{{palisade}}:then:{parent}")]);
        assert!(
            kept.is_some_and(|k| k.contains("approval")),
            "{parent} deleted"
        );
    }
    assert_eq!(
        redis.cli(&["ZCARD", "{palisade}:thens"]).as_deref(),
        Some("2")
    );
    assert_eq!(
        redis.cli(&["HGET", "{palisade}:stepend", &ended]),
        Some(step_end),
        "a step end of a later format was forgotten"
    );
    drop(workers);
}

/// A dead letter buried by one release is retried by the other's command and claimed by the
/// other's worker, both ways round: the record each writes is one the other reads and
/// revives whole.
#[test]
fn a_dead_letter_crosses_releases_both_ways() {
    let old = previous();
    let (redis, sink) = (RedisServer::start(), RedisServer::start());
    // A deposit whose upstream fails more often than it may try: dead at its first attempt.
    let json = r#"{"account":4,"cents":9,"fail_first_attempts":100}"#;
    let args = [
        "enqueue",
        "ledger.deposit",
        json,
        "--scope",
        "account:4",
        "--max-attempts",
        "1",
        "--priority",
        "3",
    ];
    run(NEW, &redis, &args);
    // `dead list`: one JSON object a line.
    let dead = |bin: &str| -> Vec<Value> {
        run(bin, &redis, &["dead", "list"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let died = || counts(NEW, &redis)["died"].as_u64().unwrap_or(0);
    let mut rounds = Vec::new();
    for (worker_bin, retry_bin) in [
        (old.as_str(), NEW),
        (NEW, old.as_str()),
        (old.as_str(), NEW),
    ] {
        let before = died();
        let w = worker(worker_bin, &redis, &sink, "w");
        wait_for("the deposit to die", Duration::from_secs(30), || {
            died() > before
        });
        w.terminate_cleanly();
        let listed = dead(retry_bin);
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(counts(NEW, &redis)["dead"], 1);
        rounds.push(listed[0].clone());
        run(retry_bin, &redis, &["dead", "retry"]);
        assert_eq!(counts(retry_bin, &redis)["ready"], 1);
    }
    // The same job throughout: its id, kind, payload, scope and attempts allowed.
    let job = |r: &Value| {
        let j = &r["job"];
        let part = |name: &str| j[name].clone();
        (
            part("id"),
            part("kind"),
            part("payload"),
            part("scope"),
            part("max_attempts"),
        )
    };
    assert!(
        rounds.iter().all(|r| job(r) == job(&rounds[0])),
        "{rounds:?}"
    );
    assert_eq!(job(&rounds[0]).1, "ledger.deposit");
    assert_eq!(balance(&sink, 4), 0);
}
