//! 300 order sagas on 3 worker processes of the example's own binary, a private Redis (the
//! coordinator and the `ledger` sink) and the real PostgreSQL (the `payments` sink), with
//! approvals sent over the HTTP API by `curl`:
//!
//! - worker A is SIGSTOPped in the middle of order 7's `reserve` step, past its lease; B and
//!   C take the run over; A wakes and its step write is refused (counted);
//! - worker C is kill -9'd while runs wait for their approvals; A and B resume them;
//! - approvals: some sent before their run exists, some after it waits, some twice (the
//!   second with the other answer: the first stays), and some never (the wait times out).
//!
//! Then: every order charged exactly once and its receipt recorded once; every refused or
//! timed-out approval refunded once and its stock released; every other order shipped once
//! with its charge's receipt; nothing dead, nothing left; every cool-off resumed within
//! [`RESUME_BOUND_MS`] of its due time.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use palisade_testkit::{free_ports, http_get, wait_for, Process, RedisServer};

const BIN: &str = env!("CARGO_BIN_EXE_saga");
const ORDERS: i64 = 300;
/// The bound this test holds a durable sleep to: from its due time to the run going on past
/// it (the worker's poll and claim, on a loaded 2-core machine).
const RESUME_BOUND_MS: i64 = 5_000;

/// What an order needs, and what the test does for it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Approval {
    /// Under 500 EUR: no wait.
    NotNeeded,
    /// Sent before the order is enqueued.
    Early(bool),
    /// Sent once the orders run.
    Late(bool),
    /// Sent late, then again with the other answer.
    Twice(bool),
    /// Never sent: the wait times out.
    Never,
}

fn approval(id: i64) -> Approval {
    if id == 7 || id % 2 == 0 {
        return Approval::NotNeeded;
    }
    match id % 10 {
        1 => Approval::Early(id % 20 == 1),
        3 => Approval::Late(true),
        5 => Approval::Twice(id % 20 == 5),
        7 => Approval::Late(false),
        _ if id % 40 == 9 => Approval::Never,
        _ => Approval::Early(true),
    }
}

/// Whether order `id` ends refunded rather than shipped.
fn refunded(id: i64) -> bool {
    match approval(id) {
        Approval::NotNeeded => false,
        Approval::Early(yes) | Approval::Late(yes) | Approval::Twice(yes) => !yes,
        Approval::Never => true,
    }
}

fn order(id: i64) -> String {
    let cents = if approval(id) == Approval::NotNeeded {
        1_000
    } else {
        90_000
    };
    // Order 7's reserve holds A long enough to be stopped in it; a wait nobody answers
    // times out in 3 s; every cool-off is a second.
    let reserve_ms = if id == 7 { 5_000 } else { 20 };
    let within = if approval(id) == Approval::Never {
        3_000
    } else {
        120_000
    };
    format!(
        r#"{{"id":{id},"cents":{cents},"reserve_ms":{reserve_ms},"cool_off_ms":1000,"approval_within_ms":{within}}}"#
    )
}

fn psql(sql: &str) -> String {
    let out = Command::new("psql")
        .args([&palisade_testkit::postgres_url(), "-tAc", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn worker(redis: &RedisServer, payments: &str, name: &str) -> Process {
    let (url, sink) = (redis.url(), format!("payments={payments}"));
    let args = ["--redis", &url, "--name", name, "--sink", &sink];
    let tuning = ["--lease", "1s", "--arbiters", "1", "--concurrency", "16"];
    Process::worker(BIN, &[&args[..], &tuning[..]].concat(), "error")
}

/// POSTs `value` to waitpoint `id`; the status and body.
fn approve(port: u16, id: i64, value: bool) -> (u16, serde_json::Value) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
        ])
        .args(["-H", "Content-Type: application/json"])
        .args(["-H", &format!("Idempotency-Key: approval-{id}-{value}")])
        .args(["-d", &format!(r#"{{"value":{value}}}"#)])
        .arg(format!(
            "http://127.0.0.1:{port}/api/v1/waitpoints/{}",
            saga::approval(id)
        ))
        .output()
        .expect("curl is installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(body).unwrap_or_default(),
    )
}

fn status(redis: &RedisServer) -> serde_json::Value {
    let out = palisade_testkit::process::run(BIN, &redis.url(), &["status", "--json"]);
    serde_json::from_str(&out).unwrap()
}

#[test]
fn three_hundred_sagas_through_a_stopped_and_a_killed_worker() {
    let redis = RedisServer::start();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let payments = format!(
        "{}?schema={schema}&options=-csearch_path%3D{schema}",
        palisade_testkit::postgres_url()
    );
    palisade_testkit::process::run(BIN, &redis.url(), &["setup", "--database", &payments]);
    let [port] = free_ports();
    let listen = format!("127.0.0.1:{port}");
    let _api = Process::spawn(
        BIN,
        &["api", "--redis", &redis.url(), "--listen", &listen],
        "warn",
    );
    wait_for("the API to serve", Duration::from_secs(20), || {
        http_get(port, "/healthz").is_some()
    });

    // Approvals sent before their orders exist: kept for the runs.
    for id in 1..=ORDERS {
        if let Approval::Early(yes) = approval(id) {
            assert_eq!(approve(port, id, yes).0, 201);
        }
    }

    // A takes order 7 and is stopped in its reserve step, past its lease.
    let a = worker(&redis, &payments, "A");
    let enqueue = |orders: &[i64]| {
        let lines: String = orders.iter().map(|id| order(*id) + "\n").collect();
        let args = ["enqueue", saga::SAGA, "--stdin", "--scope", "order:{id}"];
        palisade_testkit::process::run_with_stdin(BIN, &redis.url(), &args, &lines)
    };
    let seven = enqueue(&[7]).trim().to_owned();
    wait_for("A to hold order 7", Duration::from_secs(20), || {
        let out = palisade_testkit::process::run(
            BIN,
            &redis.url(),
            &["status", "--json", "--scope", "order:7"],
        );
        serde_json::from_str::<serde_json::Value>(&out)
            .is_ok_and(|s| s["leases"][0]["worker"] == "A")
    });
    a.signal("-STOP");
    let stopped = Instant::now();
    let b = worker(&redis, &payments, "B");
    let c = worker(&redis, &payments, "C");
    let others: Vec<i64> = (1..=ORDERS).filter(|id| *id != 7).collect();
    let jobs: BTreeMap<i64, String> = others
        .iter()
        .copied()
        .zip(enqueue(&others).lines().map(str::to_owned))
        .collect();
    std::thread::sleep(Duration::from_secs(3).saturating_sub(stopped.elapsed()));
    a.signal("-CONT");

    // C dies while runs wait for approvals (each waiting run suspended, its slot free).
    wait_for("runs to wait for approval", Duration::from_secs(60), || {
        psql(&format!("SELECT count(*) FROM {schema}.charge"))
            .parse::<i64>()
            .unwrap()
            >= 100
    });
    c.signal("-KILL");

    // `run show` of a run waiting for its approval: its journal so far (the charge, a
    // Postgres step, kept with its transaction and noted in the ledger's journal).
    let waiting = &jobs[&3];
    let show = |job: &str| -> serde_json::Value {
        let out = palisade_testkit::process::run(
            BIN,
            &redis.url(),
            &["run", "show", "--journal", saga::LEDGER, job],
        );
        serde_json::from_str(&out).unwrap()
    };
    let names = |shown: &serde_json::Value| -> Vec<String> {
        shown["journal"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_owned())
            .collect()
    };
    wait_for(
        "order 3 to wait for its approval",
        Duration::from_secs(60),
        || names(&show(waiting)) == ["reserve", "charge", "approval"],
    );
    let shown = show(waiting);
    assert_eq!(shown["journal"][1]["in"], saga::PAYMENTS, "{shown}");
    assert!(
        shown["journal"][1]["result"]
            .as_str()
            .unwrap()
            .starts_with("R-3-"),
        "{shown}"
    );
    assert_eq!(
        shown["journal"][2]["waitpoint"],
        saga::approval(3),
        "{shown}"
    );

    // The other approvals, once the orders run: some twice, the second answer the other.
    for id in 1..=ORDERS {
        match approval(id) {
            Approval::Late(yes) => assert_eq!(approve(port, id, yes).0, 201, "order {id}"),
            Approval::Twice(yes) => {
                assert_eq!(approve(port, id, yes).0, 201, "order {id}");
                let (code, again) = approve(port, id, !yes);
                assert_eq!(code, 200, "order {id}: {again}");
                assert_eq!(again["outcome"], "already");
                assert_eq!(again["value"], yes, "the first answer stays");
                assert_eq!(again["same"], false);
            }
            _ => {}
        }
    }

    // Each saga, and the job its completion sets going to clear its journal.
    wait_for("every saga to end", Duration::from_secs(180), || {
        let s = status(&redis);
        let q = &s["queues"]["default"];
        q["completed"] == 2 * ORDERS
            && ["ready", "delayed", "leased", "waiting"]
                .iter()
                .all(|k| q[*k] == 0)
    });
    let s = status(&redis);
    let queue = &s["queues"]["default"];
    assert_eq!(queue["dead"], 0, "{s}");
    for pending in ["ready", "delayed", "leased", "waiting"] {
        assert_eq!(queue[pending], 0, "{pending}: {s}");
    }

    // Charged once each, by some claim; a receipt recorded once each.
    assert_eq!(
        psql(&format!(
            "SELECT count(*), count(DISTINCT order_id) FROM {schema}.charge"
        )),
        format!("{ORDERS}|{ORDERS}")
    );
    assert_eq!(
        psql(&format!("SELECT count(*) FROM {schema}.outbox")),
        ORDERS.to_string(),
        "a receipt each"
    );
    // Refunded once each where approval was refused or never given, nowhere else.
    let want: Vec<i64> = (1..=ORDERS).filter(|id| refunded(*id)).collect();
    let got: Vec<i64> = psql(&format!(
        "SELECT order_id FROM {schema}.refund ORDER BY order_id"
    ))
    .lines()
    .map(|l| l.parse().unwrap())
    .collect();
    assert_eq!(got, want, "refunds");
    assert!(want.iter().any(|id| approval(*id) == Approval::Never));
    // Stock held by the shipped orders alone; each shipped one carries its charge's receipt.
    let ledger = |id: i64, what: &str, args: &[&str]| {
        let key = format!("palisade-ledger:d:{{order:{id}}}:{what}");
        let mut all = vec![args[0], &key];
        all.extend(&args[1..]);
        redis.cli(&all).unwrap_or_default().trim().to_owned()
    };
    for id in 1..=ORDERS {
        let held = ledger(id, "stock", &["HGET", "held"]);
        let shipped = ledger(id, "shipped", &["GET"]);
        if refunded(id) {
            assert_eq!((held.as_str(), shipped.as_str()), ("0", ""), "order {id}");
        } else {
            assert_eq!(held, "1", "order {id}");
            assert!(
                shipped.starts_with(&format!("R-{id}-")),
                "order {id}: {shipped:?}"
            );
        }
    }

    // A's late reserve was refused, its effect and journal entry alike.
    wait_for("A's refusal to be counted", Duration::from_secs(20), || {
        a.counter("palisade_durable_steps_total", &[("outcome", "refused")]) >= 1
    });
    assert!(
        a.counter(
            "palisade_fence_rejections_total",
            &[("reason", "stale_token")]
        ) >= 1
    );
    assert_eq!(ledger(7, "stock", &["HGET", "held"]), "1");
    // A run that ended leaves no journal behind.
    let shown = show(&seven);
    assert_eq!(
        (shown["state"].as_str(), names(&shown).len()),
        (Some("completed"), 0),
        "{shown}"
    );
    let journals = redis
        .cli(&[
            "--scan",
            "--pattern",
            "palisade-ledger:d:*palisade:journal:*",
        ])
        .unwrap_or_default();
    assert_eq!(journals.trim(), "", "journals left behind");

    // Every cool-off resumed within the bound, as the workers that ran them measured it
    // (C's, killed, are lost with it).
    let (mut count, mut within, mut sum) = (0, 0, 0.0);
    for worker in [&a, &b] {
        let metrics = worker.metrics().unwrap_or_default();
        let series = "palisade_durable_resume_delay_seconds";
        count += palisade::metrics::sample_sum(&metrics, &format!("{series}_count"), &[]);
        within += palisade::metrics::sample_sum(
            &metrics,
            &format!("{series}_bucket"),
            &[("le", &format!("{}", RESUME_BOUND_MS / 1000))],
        );
        sum += sum_of(&metrics, &format!("{series}_sum"));
    }
    assert!(count >= 20, "{count} resumes measured");
    eprintln!(
        "durable sleeps and timed-out waits resumed {:.0} ms past their due time on average ({count} resumes)",
        sum / count as f64 * 1000.0
    );
    assert_eq!(within, count, "a resume later than {RESUME_BOUND_MS} ms");
    drop(b);
}

/// The sum of a float series' samples (`sample_sum` counts integers).
fn sum_of(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
