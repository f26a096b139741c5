//! The operator commands (`enqueue`, `schedule list`) against a private redis-server, each
//! with what an operator reads from them checked against what the coordinator did.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use palisade_testkit::{wait_for, Process};
use palisade_testkit::{FaultProxy, RedisServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

const EMAIL: &str = r#"{"to":"ops@example.com","millis":1}"#;

/// `palisade <args>` against `redis`, with `stdin` as its input.
fn run(redis: &RedisServer, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("PALISADE_REDIS_URL", redis.url())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_owned();
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    out
}

/// `palisade <args>`, which must succeed; its stdout.
fn ok(redis: &RedisServer, args: &[&str]) -> String {
    let out = run(redis, args, "");
    assert!(
        out.status.success(),
        "palisade {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn counts(redis: &RedisServer) -> Value {
    let status: Value = serde_json::from_str(&ok(redis, &["status", "--json"])).unwrap();
    status["queues"]["default"].clone()
}

/// A `palisade worker` (with the scheduler), killed when the test ends.
fn worker(redis: &RedisServer) -> Process {
    let url = redis.url();
    let args = [
        "worker",
        "--redis",
        &url,
        "--concurrency",
        "2",
        "--arbiters",
        "1",
    ];
    Process::spawn(BIN, &args, "warn")
}

#[test]
fn stdin_enqueue_prints_what_it_added_before_a_later_batch_fails() {
    let redis = RedisServer::start();
    // The unique key of one job of the second batch holds a hash: the enqueue script refuses
    // that batch (PALISADE_CORRUPT) before it changes anything.
    redis
        .cli(&["HSET", "{palisade}:unique:k:poison", "f", "v"])
        .unwrap();
    // Blank lines among the jobs, so that jobs and input lines are numbered differently.
    let mut input = String::from("\n");
    let mut line_of_job = Vec::new();
    let mut line = 1;
    for job in 0..1500 {
        if job % 250 == 0 {
            input.push_str("  \n");
            line += 1;
        }
        // Job 500 repeats job 499's key: not added.
        let n = match job {
            500 => "499".to_owned(),
            1200 => "poison".to_owned(),
            _ => job.to_string(),
        };
        input.push_str(&format!(
            r#"{{"to":"ops@example.com","millis":1,"n":"{n}"}}"#
        ));
        input.push('\n');
        line += 1;
        line_of_job.push(line);
    }
    let out = run(
        &redis,
        &["enqueue", "email.send", "--stdin", "--unique", "k:{n}"],
        &input,
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // Every job of the first batch has its id printed (the repeat: its holder's).
    let ids: Vec<&str> = stdout.lines().collect();
    assert_eq!(ids.len(), 1000, "{stderr}");
    assert_eq!(ids[500], ids[499]);
    assert_eq!(counts(&redis)["ready"], 999);
    // The repeat and the failure are told by input line.
    assert!(
        stderr.contains(&format!(
            "stdin line {} not added: job {} holds its unique key",
            line_of_job[500], ids[499]
        )),
        "{stderr}"
    );
    let (first, last) = (line_of_job[1000], line_of_job[1499]);
    assert!(
        stderr.contains(&format!("stdin lines {first}..={last}")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("1000 jobs of the lines before line {first}")),
        "{stderr}"
    );
    assert!(stderr.contains("PALISADE_CORRUPT"), "{stderr}");

    // A line that does not decode is still named by its input line, and nothing is sent.
    let out = run(
        &redis,
        &["enqueue", "email.send", "--stdin"],
        &format!("\n\n{EMAIL}\n\n{{broken\n"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stdin line 5"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&redis)["ready"], 999);
}

#[test]
fn a_unique_enqueue_repeated_after_its_job_completed_adds_nothing_by_default() {
    let redis = RedisServer::start();
    let _worker = worker(&redis);
    let enqueue = |extra: &[&str]| {
        let args = [&["enqueue", "email.send", EMAIL][..], extra].concat();
        let out = run(&redis, &args, "");
        assert!(out.status.success(), "{args:?}: {out:?}");
        (
            String::from_utf8(out.stdout).unwrap().trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let completed = |n: u64| {
        wait_for("the job to complete", Duration::from_secs(30), || {
            counts(&redis)["completed"] == n
        })
    };

    // A webhook delivered twice, the second time after the first job ran.
    let (first, _) = enqueue(&["--unique", "hook:1"]);
    completed(1);
    // `job` finds it completed, with when and how each attempt went.
    let shown: Value = serde_json::from_str(&ok(&redis, &["job", &first])).unwrap();
    assert_eq!(
        (
            &shown["state"],
            &shown["job"]["kind"],
            &shown["job"]["queue"]
        ),
        (
            &Value::from("completed"),
            &Value::from("email.send"),
            &Value::from("default")
        ),
        "{shown:#}"
    );
    let attempts = shown["details"]["attempts"].as_array().unwrap();
    let last = attempts.last().unwrap();
    assert_eq!(last["outcome"], "completed", "{shown:#}");
    assert_eq!(last["ended_ms"], shown["completed_ms"], "{shown:#}");
    let enqueued = shown["details"]["enqueued_ms"].as_u64().unwrap();
    assert!(
        enqueued <= last["started_ms"].as_u64().unwrap(),
        "{shown:#}"
    );
    // An id it does not know, and text that is no id: one line each, exit 2.
    for (id, says) in [
        (
            "6f1c3a4e-0000-4000-8000-000000000000",
            "no live, completed or dead job",
        ),
        ("hook:1", "is not a job id"),
    ] {
        let out = run(&redis, &["job", id], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(says) && stderr.trim().lines().count() == 1,
            "{stderr}"
        );
    }
    let (again, note) = enqueue(&["--unique", "hook:1"]);
    assert_eq!(again, first, "{note}");
    assert!(note.contains("holds its unique key"), "{note}");

    // --unique-ttl 0s: the key is given up when the job is done, as before.
    let (second, _) = enqueue(&["--unique", "hook:2", "--unique-ttl", "0s"]);
    completed(2);
    let (third, note) = enqueue(&["--unique", "hook:2", "--unique-ttl", "0s"]);
    assert_ne!(third, second, "{note}");
    completed(3);
    assert_eq!(counts(&redis)["ready"], 0);
}

#[test]
fn schedule_list_shows_the_tick_the_scheduler_fires() {
    let redis = RedisServer::start();
    ok(
        &redis,
        &[
            "schedule",
            "add",
            "tick",
            "* * * * * *",
            "email.send",
            EMAIL,
        ],
    );
    let _worker = worker(&redis);
    let list = || -> Value {
        let all: Value =
            serde_json::from_str(&ok(&redis, &["schedule", "list", "--json"])).unwrap();
        all.as_array()
            .unwrap()
            .iter()
            .find(|s| s["schedule"]["name"] == "tick")
            .unwrap()
            .clone()
    };
    // Once the scheduler handles it (a new schedule starts from then), every tick fires.
    wait_for(
        "the scheduler to take the schedule",
        Duration::from_secs(30),
        || !list()["handled_through_ms"].is_null(),
    );
    for _ in 0..3 {
        let next = list()["next_ms"].as_i64().unwrap();
        let key = format!("{{palisade}}:unique:schedule:tick:{next}");
        wait_for(
            &format!("the tick at {next} to fire"),
            Duration::from_secs(10),
            || redis.cli(&["EXISTS", &key]).as_deref() == Some("1"),
        );
    }
    // Paused: listed so, and no tick fires (the mark moves on); resumed: ticks fire again.
    let said = ok(&redis, &["schedule", "pause", "tick"]);
    assert!(said.contains("schedule tick paused"), "{said}");
    assert_eq!(list()["paused"], true);
    assert!(ok(&redis, &["schedule", "list"]).contains("paused"));
    let fired = || {
        let n = redis.cli(&[
            "EVAL",
            "return #redis.call('KEYS', '{palisade}:unique:schedule:tick:*')",
            "0",
        ]);
        n.unwrap().trim().parse::<u64>().unwrap()
    };
    // (A pass under way when the pause came may still fire one tick.)
    std::thread::sleep(Duration::from_millis(1_200));
    let before = fired();
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(fired(), before, "a paused schedule fired");
    let mark = list()["handled_through_ms"].as_i64().unwrap();
    let said = ok(&redis, &["schedule", "resume", "tick"]);
    assert!(said.contains("schedule tick resumed"), "{said}");
    wait_for("a tick after the resume", Duration::from_secs(10), || {
        fired() > before
    });
    assert!(list()["handled_through_ms"].as_i64().unwrap() > mark);
    let out = run(&redis, &["schedule", "pause", "no-such"], "");
    assert!(!out.status.success());
}

/// Issue 23: an enqueue whose reply is lost after the script ran (the proxy cuts it) is
/// retried with the ids the command gave its jobs before the first attempt: each line is one
/// job. And `--id` makes running the command again the same job.
#[test]
fn an_enqueue_whose_reply_is_lost_or_that_is_run_again_adds_each_job_once() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port, 23);
    // A reply carrying job ids (36-byte bulk strings), not a PING's.
    proxy.cut_next_replies(1, b"$36\r\n");
    let input: String = (0..3)
        .map(|i| format!("{{\"to\":\"u{i}@example.com\",\"millis\":1}}\n"))
        .collect();
    let url = proxy.redis_url();
    let out = run(
        &redis,
        &["enqueue", "email.send", "--stdin", "--redis", &url],
        &input,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);
    assert_eq!(proxy.stats().cut, 1, "the reply was cut");
    // The script counts every job it is given: it ran twice, and added three.
    assert_eq!(redis.cli(&["GET", "{palisade}:seq"]).unwrap(), "6");
    assert_eq!(counts(&redis)["ready"], 3);

    let id = "0b8e9a52-3c1d-4b7e-9f00-5a1d2c3b4e5f";
    let args = ["enqueue", "email.send", EMAIL, "--id", id];
    assert_eq!(ok(&redis, &args).trim(), id);
    let again = run(&redis, &args, "");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), id);
    assert!(
        stderr.contains(&format!("job {id} is already enqueued")),
        "{stderr}"
    );
    // The same id with another payload is another request: refused, naming the id.
    let other = r#"{"to":"someone@example.com","millis":1}"#;
    let refused = run(&redis, &["enqueue", "email.send", other, "--id", id], "");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains(id) && stderr.contains("different request"),
        "{stderr}"
    );
    assert_eq!(counts(&redis)["ready"], 4);
}

/// Issue 26's operator rough edges: settings on a queue or kind nobody uses are warned about
/// (and kept), cancels are counted, caps and running counts are in `status`, `dead list`
/// spans every queue, and an unused queue can be forgotten (one holding a job cannot).
#[test]
fn operator_commands_warn_count_span_queues_and_forget() {
    let redis = RedisServer::start();
    let warned = |args: &[&str], said: &str| {
        let out = run(&redis, args, "");
        assert!(out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    };
    warned(&["pause", "typo"], "queue \"typo\" has never had a job");
    warned(&["resume", "other"], "was not paused");
    warned(&["limit", "typo", "--jobs", "5"], "has never had a job");
    warned(
        &["cap", "no.such.kind", "--running", "2"],
        "no handler for kind \"no.such.kind\"",
    );

    let a = ok(&redis, &["enqueue", "email.send", EMAIL]);
    ok(&redis, &["enqueue", "email.send", EMAIL]);
    let m = ok(&redis, &["enqueue", "email.send", EMAIL, "--queue", "mail"]);
    ok(&redis, &["cancel", a.trim()]);
    ok(&redis, &["cancel", m.trim()]);
    let status: Value = serde_json::from_str(&ok(&redis, &["status", "--json"])).unwrap();
    assert_eq!(status["queues"]["default"]["cancelled"], 1);
    assert_eq!(status["queues"]["mail"]["cancelled"], 1);
    assert_eq!(status["kinds"]["no.such.kind"]["cap"], 2);
    assert_eq!(status["kinds"]["no.such.kind"]["running"], 0);
    assert!(status["workers"].as_array().unwrap().is_empty());
    let text = ok(&redis, &["status"]);
    assert!(
        text.contains("cancelled") && text.contains("no.such.kind"),
        "{text}"
    );

    // Every queue's dead jobs, without --queue.
    let dead: Vec<Value> = ok(&redis, &["dead", "list"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut queues: Vec<&str> = dead
        .iter()
        .map(|d| d["job"]["queue"].as_str().unwrap())
        .collect();
    queues.sort_unstable();
    assert_eq!(queues, ["default", "mail"]);
    assert!(
        dead.iter().all(|d| d["died_ms"].as_u64().is_some()),
        "{dead:?}"
    );
    // A queue whose dead list another program wrote over is left out of every queue's
    // listing, and of retry's note about other queues, with a warning: the rest still shows
    // (both failed whole before, retry after it had moved the jobs).
    redis.cli(&["SADD", "{palisade}:queues", "broken"]).unwrap();
    redis
        .cli(&["SET", "{palisade}:q:broken:dead", "oops"])
        .unwrap();
    let out = run(&redis, &["dead", "list"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    assert!(stderr.contains("broken"), "{stderr}");
    let out = run(&redis, &["dead", "retry"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("dead jobs wait in mail too"), "{stderr}");
    redis.cli(&["DEL", "{palisade}:q:broken:dead"]).unwrap();
    redis.cli(&["SREM", "{palisade}:queues", "broken"]).unwrap();

    // mail holds a dead job: kept; purged, it goes; the warned-about queue goes too.
    let out = run(&redis, &["forget", "mail"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("still holds jobs"));
    ok(&redis, &["dead", "purge", "--queue", "mail"]);
    ok(&redis, &["forget", "mail"]);
    // typo is paused and limited: forgetting it would drop both, so it is refused until then.
    let out = run(&redis, &["forget", "typo"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("paused or rate-limited"));
    ok(&redis, &["resume", "typo"]);
    ok(&redis, &["limit", "typo", "--off"]);
    ok(&redis, &["forget", "typo"]);
    let status: Value = serde_json::from_str(&ok(&redis, &["status", "--json"])).unwrap();
    let listed: Vec<&String> = status["queues"].as_object().unwrap().keys().collect();
    assert_eq!(listed, ["default"]);
    assert!(
        status["paused"].as_array().unwrap().is_empty(),
        "typo was resumed before it was forgotten"
    );
}

/// Every worker process registers itself: `status` lists a running `palisade worker` with its
/// pid, queues and concurrency from its heartbeat, and drops it once it is gone (at once when
/// it drained, after three missed beats when it was killed).
#[test]
fn status_lists_live_worker_processes_from_their_heartbeats() {
    let redis = RedisServer::start();
    let workers = || -> Vec<Value> {
        let status: Value = serde_json::from_str(&ok(&redis, &["status", "--json"])).unwrap();
        status["workers"].as_array().unwrap().clone()
    };
    let process = worker(&redis);
    let pid: u32 = process.pid().parse().unwrap();
    wait_for("the worker's heartbeat", Duration::from_secs(30), || {
        workers().iter().any(|w| w["pid"] == pid)
    });
    let listed = workers();
    let w = listed.iter().find(|w| w["pid"] == pid).unwrap();
    assert_eq!(w["concurrency"], 2);
    assert_eq!(w["queues"], serde_json::json!(["default"]));
    assert_eq!(w["version"], env!("CARGO_PKG_VERSION"));
    process.signal("-KILL");
    // Three beats (15 s) missed, it leaves the list.
    wait_for("the beat to lapse", Duration::from_secs(40), || {
        !workers().iter().any(|w| w["pid"] == pid)
    });
    // A worker that drains (SIGTERM) leaves at once: its last beat lapses as it is written.
    let drained = worker(&redis);
    let pid: u32 = drained.pid().parse().unwrap();
    wait_for(
        "the second worker's heartbeat",
        Duration::from_secs(30),
        || workers().iter().any(|w| w["pid"] == pid),
    );
    let stopped = std::time::Instant::now();
    drained.terminate();
    assert!(
        !workers().iter().any(|w| w["pid"] == pid),
        "a drained worker is still listed {:?} after its SIGTERM",
        stopped.elapsed()
    );
}

/// Groups from the command line: `enqueue --group` (a field of the payload filling it),
/// `group` changing one limit at a time and keeping the others, and what `status` shows; a
/// worker then runs the paused group's jobs only once it is resumed.
#[test]
fn groups_from_the_command_line() {
    let redis = RedisServer::start();
    for tenant in ["7", "7", "9"] {
        let payload = format!(r#"{{"to":"t{tenant}@example.com","millis":1,"tenant":"{tenant}"}}"#);
        ok(
            &redis,
            &[
                "enqueue",
                "email.send",
                &payload,
                "--group",
                "tenant:{tenant}",
            ],
        );
    }
    let said = ok(&redis, &["group", "tenant:7", "--cap", "1"]);
    assert!(
        said.contains("group tenant:7: 2 ready, 0 running (cap 1)"),
        "{said}"
    );
    let said = ok(&redis, &["group", "tenant:7", "--pause"]);
    assert!(said.contains("cap 1") && said.contains("paused"), "{said}");
    let said = ok(&redis, &["group", "tenant:7", "--jobs", "5", "--per", "1m"]);
    assert!(
        said.contains("cap 1") && said.contains("paused") && said.contains("at most 5 per 1m"),
        "one limit changed, the others kept: {said}"
    );
    let said = ok(&redis, &["group", "tenant:7", "--jobs", "8"]);
    assert!(said.contains("at most 8 per 1m"), "the period kept: {said}");
    let refused = run(&redis, &["group", "tenant:7", "--cap", "0"], "");
    assert!(!refused.status.success());
    let refused = run(&redis, &["group", "tenant:9", "--per", "1m"], "");
    assert!(
        !refused.status.success(),
        "no rate limit to change the period of"
    );
    let status: Value = serde_json::from_str(&ok(&redis, &["status", "--json"])).unwrap();
    let top = status["groups"]["default"].as_array().unwrap();
    assert_eq!(top[0]["group"], "tenant:7");
    assert_eq!(top[0]["ready"], 2);
    assert_eq!(status["limited_groups"].as_array().unwrap().len(), 1);
    assert_eq!(status["limited_groups"][0]["limits"]["paused"], true);
    let text = ok(&redis, &["status"]);
    assert!(text.contains("groups with limits (1)"), "{text}");

    // A worker runs tenant 9's job; tenant 7's wait, paused, until resumed.
    let _worker = worker(&redis);
    wait_for("tenant 9's job done", Duration::from_secs(20), || {
        counts(&redis)["completed"] == 1
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(counts(&redis)["ready"], 2, "a paused group starts nothing");
    ok(&redis, &["group", "tenant:7", "--resume", "--no-rate"]);
    wait_for("tenant 7's jobs done", Duration::from_secs(20), || {
        counts(&redis)["completed"] == 3
    });
}

/// Issue 57: `dead retry` takes every dead letter the filters take in one command (it
/// stopped at 100, silently), says how many, and `dead list` pages newest first.
#[test]
fn a_thousand_dead_letters_go_back_in_one_command() {
    use palisade::{LeaseStore, RedisLeaseStore};
    let redis = RedisServer::start();
    // 1,000 dead letters in `mass`: kinds a and b in turn, every fourth one timed out.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let died: Vec<String> = rt.block_on(async {
        let store = RedisLeaseStore::new(
            palisade::store::redis::pool(&redis.url()).unwrap(),
            "palisade",
        );
        let jobs = (0..1000).map(|i| {
            palisade::NewJob::raw(if i % 2 == 0 { "a" } else { "b" }, "null").with_queue("mass")
        });
        store.enqueue(jobs.collect()).await.unwrap();
        let mut died = Vec::new();
        while died.len() < 1000 {
            let claims = store
                .claim("mass", "seed", 250, Duration::from_secs(600))
                .await
                .unwrap();
            let dead = claims.iter().map(|c| {
                let reason = if died.len() % 4 == 0 {
                    "smtp timeout"
                } else {
                    "no template"
                };
                died.push(c.job.id.to_string());
                (
                    c.lease.id,
                    palisade::Settlement::Dead {
                        reason: reason.into(),
                    },
                )
            });
            let dead: Vec<_> = dead.collect();
            assert!(store.settle(dead).await.unwrap().iter().all(Result::is_ok));
        }
        died
    });
    let counts = |redis: &RedisServer| -> Value {
        let status: Value = serde_json::from_str(&ok(redis, &["status", "--json"])).unwrap();
        status["queues"]["mass"].clone()
    };
    // Newest first, a page at a time.
    let page: Vec<Value> = ok(
        &redis,
        &[
            "dead", "list", "--queue", "mass", "--limit", "10", "--page", "2",
        ],
    )
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    let ids: Vec<&str> = page
        .iter()
        .map(|d| d["job"]["id"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = died
        .iter()
        .rev()
        .skip(10)
        .take(10)
        .map(String::as_str)
        .collect();
    assert_eq!(ids, want);
    // None died an hour ago; the timed-out ones of kind a (every fourth death is a timeout;
    // the kinds alternate in claim order, so count them from the list).
    assert_eq!(
        ok(
            &redis,
            &["dead", "purge", "--queue", "mass", "--older-than", "1h"]
        )
        .trim(),
        "0 jobs deleted of queue mass (1000 dead letters read)"
    );
    let listed = ok(
        &redis,
        &[
            "dead", "list", "--queue", "mass", "--kind", "a", "--reason", "timeout", "--limit",
            "1000",
        ],
    );
    let timed_out_a = listed.lines().count();
    assert!(timed_out_a > 0);
    assert_eq!(
        ok(
            &redis,
            &["dead", "retry", "--queue", "mass", "--kind", "a", "--reason", "timeout"]
        )
        .trim(),
        format!("{timed_out_a} jobs retried of queue mass (1000 dead letters read)")
    );
    assert_eq!(counts(&redis)["ready"], timed_out_a);
    // The rest, in one command.
    let rest = 1000 - timed_out_a;
    assert_eq!(
        ok(&redis, &["dead", "retry", "--queue", "mass"]).trim(),
        format!("{rest} jobs retried of queue mass ({rest} dead letters read)")
    );
    let c = counts(&redis);
    assert_eq!(
        (c["ready"].as_u64(), c["dead"].as_u64()),
        (Some(1000), Some(0)),
        "{c}"
    );
    // Nobody claims mass: status says so, in text and in JSON.
    let text = ok(&redis, &["status"]);
    let row = text.lines().find(|l| l.starts_with("mass ")).unwrap();
    assert!(row.ends_with("(no live worker claims it)"), "{row}");
    let status: Value = serde_json::from_str(&ok(&redis, &["status", "--json"])).unwrap();
    assert_eq!(status["claimed_by"]["mass"], 0, "{status}");

    // All 1,000 dead again, and back in one command with no filter, counted.
    rt.block_on(async {
        let store = RedisLeaseStore::new(
            palisade::store::redis::pool(&redis.url()).unwrap(),
            "palisade",
        );
        let mut again = 0;
        while again < 1000 {
            let claims = store
                .claim("mass", "seed", 250, Duration::from_secs(600))
                .await
                .unwrap();
            again += claims.len();
            let dead = claims.iter().map(|c| {
                let reason = "down again".to_owned();
                (c.lease.id, palisade::Settlement::Dead { reason })
            });
            assert!(store
                .settle(dead.collect())
                .await
                .unwrap()
                .iter()
                .all(Result::is_ok));
        }
    });
    assert_eq!(counts(&redis)["dead"].as_u64(), Some(1000));
    assert_eq!(
        ok(&redis, &["dead", "retry", "--queue", "mass"]).trim(),
        "1000 jobs retried of queue mass (1000 dead letters read)"
    );
    let c = counts(&redis);
    assert_eq!(
        (c["ready"].as_u64(), c["dead"].as_u64()),
        (Some(1000), Some(0)),
        "{c}"
    );
}

/// Issue 57: the first worker records where each sink lives; a worker whose sink URL points
/// elsewhere (a Postgres database where the fleet uses the coordinator's Redis) is refused
/// at start with one line naming both, before it runs a job. The same Redis written another
/// way is the same sink (a store is known by the id it keeps, so a proxy in front of it is
/// too: `processes.rs` runs workers through fault proxies beside direct ones).
#[test]
fn a_worker_with_a_sink_somewhere_else_is_refused() {
    let redis = RedisServer::start();
    let first = worker(&redis);
    wait_for("the first worker", Duration::from_secs(20), || {
        ok(&redis, &["sinks", "list"]).contains("ledger redis:")
    });
    let listed = ok(&redis, &["sinks", "list"]);
    let port = redis
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert!(
        listed.starts_with("ledger redis:")
            && listed.ends_with(&format!(" redis://127.0.0.1:{port}/0\n")),
        "{listed}"
    );

    let postgres = "postgres://postgres@127.0.0.1:5432/test?schema=palisade_elsewhere";
    let out = run(
        &redis,
        &[
            "worker",
            "--arbiters",
            "1",
            "--sink",
            &format!("ledger={postgres}"),
        ],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let refusal: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("sink ledger"))
        .collect();
    assert_eq!(refusal.len(), 1, "{stderr}");
    assert!(
        refusal[0].contains("postgres://127.0.0.1:5432/test?schema=palisade_elsewhere")
            && refusal[0].contains(&format!("redis://127.0.0.1:{port}/0"))
            && refusal[0].contains("palisade sinks forget ledger"),
        "{stderr}"
    );

    // The same Redis with its db spelled out: the same place; the worker starts.
    let same = format!("ledger=redis://127.0.0.1:{port}/0");
    let args = [
        "worker",
        "--redis",
        &redis.url(),
        "--arbiters",
        "1",
        "--sink",
        &same,
    ];
    let second = Process::spawn(BIN, &args, "warn");
    wait_for("the second worker", Duration::from_secs(20), || {
        let status: Value = serde_json::from_str(&ok(&redis, &["status", "--json"])).unwrap();
        status["workers"].as_array().unwrap().len() == 2
    });
    // Not forgotten while workers are live (one of them could be the misconfigured one);
    // forced (to move it on purpose), the next worker records its own.
    let refused = run(&redis, &["sinks", "forget", "ledger"], "");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("workers are live"));
    drop((first, second));
    let forgotten = ok(&redis, &["sinks", "forget", "ledger", "--force"]);
    assert!(forgotten.contains("location forgotten"), "{forgotten}");
    assert!(!ok(&redis, &["sinks", "list"]).contains("ledger"));
}

/// Splits a shell command line as the guides write them: words, `'…'` quoted, and `[…]`
/// optional parts left out.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut word, mut quoted, mut optional) = (Vec::new(), String::new(), false, 0);
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            '[' if !quoted => optional += 1,
            ']' if !quoted => optional -= 1,
            ' ' if !quoted => {
                if !word.is_empty() && optional == 0 {
                    out.push(std::mem::take(&mut word));
                }
                word.clear();
            }
            _ if optional == 0 => word.push(c),
            _ => {}
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Issue 57: what the guides tell an operator to run works with the binary the README builds:
/// every `palisade enqueue` line of README.md and docs/*.md, and every kind and payload of an
/// HTTP example body, is one this binary takes; `palisade kinds` lists each kind with an
/// example that enqueues.
#[test]
fn the_guides_commands_work_with_the_binary_the_readme_builds() {
    let redis = RedisServer::start();
    let kinds: Vec<Value> = ok(&redis, &["kinds", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(kinds.len() >= 6, "{kinds:?}");
    for k in &kinds {
        let example = k["example"].to_string();
        ok(&redis, &["enqueue", k["kind"].as_str().unwrap(), &example]);
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut guides = vec![format!("{root}/README.md")];
    for entry in std::fs::read_dir(format!("{root}/docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            guides.push(path.display().to_string());
        }
    }
    let (mut commands, mut bodies) = (0, 0);
    for guide in &guides {
        let text = std::fs::read_to_string(guide).unwrap();
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("palisade enqueue ") {
                let rest = rest.split(" #").next().unwrap();
                let mut args = vec!["enqueue".to_owned()];
                args.extend(words(rest));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let out = run(&redis, &args, "");
                assert!(
                    out.status.success(),
                    "{guide}: `{line}`: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                commands += 1;
            }
            // An HTTP body in a curl example: its kind and payload enqueue.
            if let Some(body) = line.strip_prefix("-d '").and_then(|b| b.strip_suffix('\'')) {
                let body: Value = serde_json::from_str(body).unwrap();
                if let Some(kind) = body["kind"].as_str() {
                    let payload = body["payload"].to_string();
                    let out = run(&redis, &["enqueue", kind, &payload], "");
                    assert!(
                        out.status.success(),
                        "{guide}: body {body}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    bodies += 1;
                }
            }
        }
    }
    assert!(
        commands >= 2 && bodies >= 2,
        "{commands} commands, {bodies} bodies"
    );
}

/// Issue 57: one way to lift a cap or a limit (`off` as the value, the older `--off`,
/// `--no-cap` and `--no-rate` still taken), `cap KIND` / `limit QUEUE` alone print the current
/// setting, and a schedule's scope is filled like an enqueue's.
#[test]
fn caps_and_limits_are_set_shown_and_lifted_one_way() {
    let redis = RedisServer::start();
    let line = |args: &[&str]| ok(&redis, args).trim().to_owned();
    assert_eq!(
        line(&["cap", "email.send"]),
        "kind email.send: no concurrency cap"
    );
    line(&["cap", "email.send", "--running", "3"]);
    assert_eq!(
        line(&["cap", "email.send"]),
        "kind email.send: at most 3 running at once"
    );
    line(&["cap", "email.send", "--running", "off"]);
    assert_eq!(
        line(&["cap", "email.send"]),
        "kind email.send: no concurrency cap"
    );
    line(&["cap", "email.send", "--running", "2"]);
    line(&["cap", "email.send", "--off"]);
    assert_eq!(
        line(&["cap", "email.send"]),
        "kind email.send: no concurrency cap"
    );

    line(&["limit", "default", "--jobs", "5", "--per", "1m"]);
    assert_eq!(
        line(&["limit", "default"]),
        "queue default: at most 5 jobs per 1m"
    );
    line(&["limit", "default", "--jobs", "off"]);
    assert_eq!(line(&["limit", "default"]), "queue default: no rate limit");
    // A period alone would be ignored: refused.
    let out = run(&redis, &["limit", "default", "--per", "5s"], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--per goes with --jobs N"));

    let shown = line(&["group", "acme", "--cap", "4", "--jobs", "10", "--per", "1s"]);
    assert!(
        shown.contains("cap 4") && shown.contains("10 per 1s"),
        "{shown}"
    );
    let shown = line(&["group", "acme", "--cap", "off", "--jobs", "off"]);
    assert!(
        !shown.contains("cap 4") && !shown.contains("per"),
        "{shown}"
    );
    let shown = line(&["group", "acme", "--cap", "4", "--jobs", "10"]);
    assert!(shown.contains("cap 4"), "{shown}");
    let shown = line(&["group", "acme", "--no-cap", "--no-rate"]);
    assert!(
        !shown.contains("cap 4") && !shown.contains("per"),
        "{shown}"
    );

    let out = run(&redis, &["cap", "email.send", "--running", "lots"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a whole number"));

    // A schedule's scope fills `{field}` from its payload, as enqueue's does (it was kept
    // with the braces in it): a field the payload lacks is refused.
    let add = |scope: &str| {
        let payload = r#"{"to":"ops@example.com","millis":1}"#;
        let args = [
            "schedule",
            "add",
            "n",
            "0 3 * * *",
            "email.send",
            payload,
            "--scope",
            scope,
        ];
        run(&redis, &args, "")
    };
    assert!(add("mail:{to}").status.success());
    let refused = add("mail:{nope}");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no scalar field \"nope\""));
}

/// Issue 57: a queue nobody consumes can be seen and cleared: `jobs` lists its ready and
/// delayed jobs (next first), `clear` says what it would do, then with `--yes` cancels every
/// one (to the dead letters, where `dead retry` brings them back) and counts them.
#[test]
fn a_queue_is_listed_and_cleared_whole() {
    let redis = RedisServer::start();
    let mut lines = String::new();
    for n in 0..1200 {
        lines.push_str(&format!(r#"{{"to":"u{n}@example.com","millis":1}}"#));
        lines.push('\n');
    }
    let out = run(
        &redis,
        &["enqueue", "email.send", "--stdin", "--queue", "backlog"],
        &lines,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let later = r#"{"to":"later@example.com","millis":1}"#;
    for _ in 0..3 {
        ok(
            &redis,
            &[
                "enqueue",
                "email.send",
                later,
                "--queue",
                "backlog",
                "--delay",
                "1h",
            ],
        );
    }
    let listed: Vec<Value> = ok(&redis, &["jobs", "--queue", "backlog", "--limit", "5"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 5);
    assert!(listed
        .iter()
        .all(|j| j["state"] == "ready" && j["kind"] == "email.send"));
    assert!(
        listed[0]["payload"]
            .as_str()
            .unwrap()
            .contains("u0@example.com"),
        "{listed:?}"
    );
    let delayed = ok(
        &redis,
        &["jobs", "--queue", "backlog", "--state", "delayed"],
    );
    assert_eq!(delayed.lines().count(), 3);

    let asked = ok(&redis, &["clear", "backlog"]);
    assert!(
        asked.contains("1200 ready and 3 delayed jobs would be cancelled"),
        "{asked}"
    );
    assert_eq!(
        counts_of(&redis, "backlog")["ready"],
        1200,
        "nothing before --yes"
    );
    let done = ok(&redis, &["clear", "backlog", "--yes"]);
    assert_eq!(done.trim(), "queue backlog: 1203 jobs cancelled");
    let c = counts_of(&redis, "backlog");
    assert_eq!(
        (
            c["ready"].as_u64(),
            c["delayed"].as_u64(),
            c["dead"].as_u64()
        ),
        (Some(0), Some(0), Some(1203)),
        "{c}"
    );
    assert_eq!(c["cancelled"], 1203);
    let back = ok(&redis, &["dead", "retry", "--queue", "backlog"]);
    assert!(back.starts_with("1203 jobs retried"), "{back}");
}

fn counts_of(redis: &RedisServer, queue: &str) -> Value {
    let status: Value = serde_json::from_str(&ok(redis, &["status", "--json"])).unwrap();
    status["queues"][queue].clone()
}
