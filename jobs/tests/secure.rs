//! Password-protected and TLS-only private redis-servers: a job runs through each, a wrong
//! password or an untrusted certificate is a clear, quick error, and secrets never show up.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use palisade_testkit::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const SECRET: &str = "hunter2-not-for-logs";

fn run(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    (out, started.elapsed())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Enqueues a deposit, runs a worker until it completes, and returns everything printed.
fn job_round_trip(url: &str, extra: &[&str]) -> String {
    let deposit = [
        "ledger.deposit",
        r#"{"account":1,"cents":9}"#,
        "--scope",
        "account:1",
    ];
    round_trip(url, extra, &deposit)
}

/// Enqueues the job `job` (kind, payload, options), runs a worker until it completes, and
/// returns everything printed.
fn round_trip(url: &str, extra: &[&str], job: &[&str]) -> String {
    let mut printed = String::new();
    let enqueue = [&["enqueue", "--redis", url][..], extra, job].concat();
    let (out, _) = run(&enqueue);
    assert!(out.status.success(), "enqueue: {}", text(&out));
    printed += &text(&out);
    let worker = [
        &[
            "worker", "--redis", url, "--lease", "2s", "--name", "secure",
        ][..],
        extra,
    ]
    .concat();
    let mut child = Command::new(BIN)
        .args(&worker)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = [&["status", "--json", "--redis", url][..], extra].concat();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (out, _) = run(&status);
        printed += &text(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if v["queues"]["default"]["completed"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job never completed: {}",
            text(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let _ = child.wait();
    let out = child.wait_with_output().unwrap();
    printed + &text(&out)
}

#[test]
fn password_protected_redis_works_and_never_leaks_the_password() {
    let redis =
        RedisServer::start_with(&["--save", "", "--appendonly", "no", "--requirepass", SECRET]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", redis.port);
    let printed = job_round_trip(&url, &[]);
    assert!(printed.contains("worker started"), "{printed}");
    assert!(!printed.contains(SECRET), "the password leaked:\n{printed}");

    let wrong = format!("redis://:{SECRET}-wrong@127.0.0.1:{}", redis.port);
    let (out, took) = run(&["status", "--redis", &wrong]);
    assert_eq!(out.status.code(), Some(2));
    let msg = text(&out);
    assert!(
        msg.contains("cannot reach Redis") && msg.to_lowercase().contains("authentication failed"),
        "{msg}"
    );
    assert!(!msg.contains(SECRET), "{msg}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let (out, _) = run(&[
        "status",
        "--redis",
        &format!("redis://127.0.0.1:{}", redis.port),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "no password must fail too: {}",
        text(&out)
    );
}

#[test]
fn tls_redis_works_with_its_ca_and_refuses_an_untrusted_certificate() {
    let redis = RedisServer::start_tls();
    let ca = redis.tls_ca().display().to_string();
    let printed = job_round_trip(&redis.url(), &["--redis-ca-file", &ca]);
    assert!(printed.contains("worker started"), "{printed}");

    let (out, took) = run(&["status", "--redis", &redis.url()]);
    assert_eq!(out.status.code(), Some(2));
    let msg = text(&out);
    assert!(
        msg.contains("cannot reach Redis") && msg.to_lowercase().contains("certificate"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // The one CA option serves the TLS links and is ignored by plain ones (a redis:// sink
    // beside a TLS Postgres must work): a plain URL to this TLS-only port is refused by the
    // server, quickly and in one line.
    let (out, took) = run(&[
        "status",
        "--redis",
        &redis.url().replace("rediss", "redis"),
        "--redis-ca-file",
        &ca,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let msg = text(&out);
    assert!(msg.contains("cannot reach Redis"), "{msg}");
    assert_eq!(msg.trim().lines().count(), 1, "{msg}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// A Redis Cluster that speaks only TLS: a job runs through it with `--ca-file`; without the
/// CA, the first command fails quickly with one line. (An unfenced job: the sample ledger's
/// keys are not named for a cluster's slots — `a_tls_cluster_works_with_its_ca_and_refuses_
/// another` in the runtime's tests writes through a sink on a TLS cluster.)
#[test]
fn a_tls_cluster_runs_a_job_with_its_ca() {
    let cluster = palisade_testkit::RedisCluster::start_tls();
    let ca = cluster.tls_ca().display().to_string();
    let nodes = cluster.urls().join(",");
    let email = ["email.send", r#"{"to":"a@example.com","millis":10}"#];
    let printed = round_trip(&nodes, &["--redis-cluster", "--ca-file", &ca], &email);
    assert!(printed.contains("worker started"), "{printed}");

    // With the default log level (no RUST_LOG): redis-rs' own per-node warnings are debug
    // detail then, and the one line is ours.
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["status", "--redis-cluster", "--redis", &nodes])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(2));
    let msg = text(&out);
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
    assert_eq!(msg.trim().lines().count(), 1, "{msg}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

/// A master found through its sentinels (`redis+sentinel://`): a job runs through it, the
/// coordinator and the sink both on the master the sentinels name.
#[test]
fn a_sentinel_url_runs_a_job() {
    let group = palisade_testkit::RedisSentinels::start();
    let printed = job_round_trip(&group.url(), &[]);
    assert!(printed.contains("worker started"), "{printed}");
    let master = &group.nodes[group.master()];
    assert_eq!(
        master
            .cli(&["HGET", "palisade-ledger:d:account:1", "balance"])
            .as_deref(),
        Some("9"),
        "the deposit went to the master"
    );
}
