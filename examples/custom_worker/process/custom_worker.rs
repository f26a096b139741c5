//! The proof a user would run: the user's own binary (built only from Palisade's public API)
//! enqueues 3,000 of its jobs with its own `enqueue`, runs three of its worker processes on a
//! private Redis, one is SIGSTOPped past its lease and another killed with -9 mid-run, and
//! every total is exact, a stale write was refused, nothing is pending and nothing is dead.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use palisade_testkit::RedisServer;
use palisade_testkit::{wait_for, Process};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_custom-worker");
const JOBS: u32 = 3000;
const SKUS: u32 = 50;

fn worker(redis: &RedisServer, name: &str) -> Process {
    let url = redis.url();
    let args = ["--redis", &url, "--name", name, "--lease", "1s"];
    let tuning = ["--arbiters", "1", "--concurrency", "16", "--drain", "1s"];
    Process::worker(BIN, &[&args[..], &tuning[..]].concat(), "error")
}

fn cli(redis: &RedisServer, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env("PALISADE_REDIS_URL", redis.url())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn status(redis: &RedisServer) -> Value {
    serde_json::from_str(&cli(redis, &["status", "--json", "--leases", "100"])).unwrap()
}

fn stale_refusals(worker: &Process) -> u64 {
    let text = worker.metrics().unwrap_or_default();
    palisade::metrics::sample_sum(
        &text,
        "palisade_fence_rejections_total",
        &[("reason", "stale_token")],
    )
}

#[test]
fn custom_worker_survives_a_pause_and_a_kill_with_exact_totals() {
    let redis = RedisServer::start();
    // 3,000 reservations over 50 SKUs; the first one of SKU 0 calls a slow "warehouse API",
    // so whoever holds it can be paused mid-job.
    let mut want = vec![0i64; SKUS as usize];
    let mut lines = String::new();
    for i in 0..JOBS {
        let (sku, qty) = (i % SKUS, i64::from(i % 7) + 1);
        want[sku as usize] += qty;
        let hold = if i == 0 { 1500 } else { 0 };
        lines += &format!("{{\"sku\":{sku},\"qty\":{qty},\"hold_ms\":{hold}}}\n");
    }
    let mut enqueue = Command::new(BIN)
        .args([
            "enqueue",
            "stock.reserve",
            "--stdin",
            "--scope",
            "sku:{sku}",
        ])
        .env("PALISADE_REDIS_URL", redis.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    enqueue
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let out = enqueue.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().lines().count(),
        JOBS as usize
    );
    // The binary's own command reaches the same coordinator as the built-in ones.
    assert_eq!(cli(&redis, &["pending"]).trim(), JOBS.to_string());

    let workers: Vec<Process> = ["a", "b", "c"].iter().map(|n| worker(&redis, n)).collect();
    // Pause whoever holds the slow SKU-0 job, past its 1 s lease.
    let mut holder = None;
    wait_for("the slow job to be held", Duration::from_secs(20), || {
        let s = status(&redis);
        holder = s["leases"].as_array().unwrap().iter().find_map(|l| {
            (l["scope"] == "sku:0").then(|| {
                (
                    l["worker"].as_str().unwrap().to_owned(),
                    l["token"].as_u64().unwrap(),
                )
            })
        });
        holder.is_some()
    });
    let (paused_name, paused_token) = holder.unwrap();
    let paused = ["a", "b", "c"]
        .iter()
        .position(|n| *n == paused_name)
        .unwrap();
    workers[paused].signal("-STOP");
    // Kill another worker while it holds jobs (right away, while there is plenty of work).
    let killed = (paused + 1) % 3;
    wait_for("the victim to hold jobs", Duration::from_secs(20), || {
        status(&redis)["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["worker"] == ["a", "b", "c"][killed])
    });
    workers[killed].signal("-KILL");
    let _spare = worker(&redis, "d");
    // Someone else writes SKU 0 under a newer token: the paused holder is now stale.
    let fence = || {
        redis
            .cli(&["GET", "palisade-inventory:{sku:0}:fence"])
            .and_then(|f| f.split('\t').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_for(
        "a newer generation to write SKU 0",
        Duration::from_secs(30),
        || fence() > paused_token,
    );
    workers[paused].signal("-CONT");
    wait_for(
        "the paused holder's late write to be refused",
        Duration::from_secs(30),
        || stale_refusals(&workers[paused]) >= 1,
    );
    wait_for("every job settled", Duration::from_secs(90), || {
        let q = &status(&redis)["queues"]["default"];
        q["completed"] == JOBS
            && q["ready"] == 0
            && q["waiting"] == 0
            && q["leased"] == 0
            && q["delayed"] == 0
    });
    let q = status(&redis)["queues"]["default"].clone();
    assert_eq!(q["dead"], 0, "{q}");
    for (sku, reserved) in want.iter().enumerate() {
        let got = redis.cli(&[
            "HGET",
            &format!("palisade-inventory:d:stock:{sku}"),
            "reserved",
        ]);
        assert_eq!(
            got.and_then(|v| v.parse::<i64>().ok()),
            Some(*reserved),
            "sku {sku}"
        );
    }
    assert_eq!(cli(&redis, &["dead", "list"]).trim(), "");
    assert_eq!(cli(&redis, &["pending"]).trim(), "0");
    // And a command of its own reads the sink where the workers wrote it.
    for sku in [0, 7, 49] {
        assert_eq!(
            cli(&redis, &["stock", &sku.to_string()]).trim(),
            want[sku].to_string()
        );
    }
    assert_eq!(cli(&redis, &["stock", "no-such-sku"]).trim(), "0");
    assert_eq!(cli(&redis, &["pending", "elsewhere"]).trim(), "0");
}
