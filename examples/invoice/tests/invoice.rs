//! The stale-holder scenario with the Postgres sink and the outbox, with real parts: the
//! example's own worker binary (two processes, each with its outbox relay) on a private Redis,
//! the real PostgreSQL, and a local HTTP receiver for receipts. Worker A claims the invoice
//! and is SIGSTOPped past its lease; B settles it and its relay sends the receipt; A wakes
//! and runs the same job body — its transaction is refused before its SQL runs. The invoice
//! is paid once, by B's token, and exactly one receipt is recorded and sent.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_testkit::RedisServer;
use palisade_testkit::{http_receiver, wait_for, Process};

const BIN: &str = env!("CARGO_BIN_EXE_invoice");

/// Records the `Idempotency-Key` of every POST and answers 200.
fn receiver() -> (u16, Arc<Mutex<Vec<String>>>) {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let port = http_receiver(move |request| {
        seen.lock().unwrap().push(request.key.unwrap_or_default());
        "200 OK"
    });
    (port, keys)
}

fn worker(redis: &RedisServer, sink: &str, receipts: u16, name: &str) -> Process {
    let (url, billing) = (redis.url(), format!("billing={sink}"));
    let email = format!("email=http://127.0.0.1:{receipts}/receipts");
    let args = ["--redis", &url, "--name", name, "--sink", &billing];
    let tuning = ["--lease", "1s", "--arbiters", "1", "--concurrency", "4"];
    let relay = ["--relay", "--target", &email];
    Process::worker(BIN, &[&args[..], &tuning[..], &relay[..]].concat(), "error")
}

fn invoice(redis: &RedisServer, args: &[&str]) -> String {
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

fn psql(sql: &str) -> String {
    let url = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let out = Command::new("psql")
        .args([&url, "-tAc", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn a_paused_worker_cannot_settle_the_invoice_again_or_send_a_second_receipt() {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let base = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    // The sink's tables and the user's `invoice` table in one schema of this test's own.
    let sink = format!("{base}?schema={schema}&options=-csearch_path%3D{schema}");
    the_stale_holder_is_refused(&schema, &sink);
}

/// Issue 56: the same through a private PgBouncer in transaction mode, as most managed
/// Postgres offerings run one (the sink URL says `pooler=transaction`). On the code before
/// issue 56 the sink's cached named statements met other clients' server connections: jobs
/// dead-lettered with `26000 prepared statement "s…" does not exist` and the relay failed.
#[test]
fn through_a_transaction_pooler_the_stale_holder_is_refused_and_nothing_is_lost() {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let bouncer = palisade_testkit::PgBouncer::start(&schema);
    the_stale_holder_is_refused(&schema, &bouncer.sink_url(&schema));
}

/// Invoices the scenario sets up; all but the contended one are settled at once afterwards.
const INVOICES: i64 = 300;

/// Worker A holds invoice 7 and is SIGSTOPped past its lease; B settles it and its relay
/// sends the receipt; A wakes and is refused. Paid once, by B's token; one receipt recorded
/// and sent. Then both workers settle the other invoices at once (their pools sharing the
/// server connections behind a pooler): every invoice paid once, a receipt each, sent once,
/// nothing dead.
fn the_stale_holder_is_refused(schema: &str, sink: &str) {
    let redis = RedisServer::start();
    invoice(
        &redis,
        &[
            "setup",
            "--database",
            sink,
            "--invoices",
            &INVOICES.to_string(),
        ],
    );
    let (receipts, keys) = receiver();

    let a = worker(&redis, sink, receipts, "A");
    // A holds it long enough to be stopped mid-hold: with 1.5 s, a slow `status` call on a
    // loaded machine (a fresh clone's CI) saw A holding only as it finished, A settled on its
    // own, and no stale write was left to refuse.
    let job = r#"{"invoice": 7, "hold_ms": 5000}"#;
    invoice(
        &redis,
        &["enqueue", invoice::SETTLE, job, "--scope", "invoice:7"],
    );
    // A's lease, not A's heartbeat (the `workers` list names A as soon as it starts: stopped
    // then, before its claim, A had nothing to write and B ran the job alone).
    wait_for("A to hold the invoice", Duration::from_secs(20), || {
        let status = invoice(&redis, &["status", "--json", "--scope", "invoice:7"]);
        serde_json::from_str::<serde_json::Value>(&status)
            .is_ok_and(|s| s["leases"][0]["worker"] == "A")
    });
    a.signal("-STOP");
    let stopped = Instant::now();
    let b = worker(&redis, sink, receipts, "B");
    wait_for(
        "B to settle and its relay to send the receipt",
        Duration::from_secs(30),
        || keys.lock().unwrap().len() == 1,
    );
    std::thread::sleep(Duration::from_secs(3).saturating_sub(stopped.elapsed()));
    a.signal("-CONT");
    wait_for(
        "A's transaction to be refused",
        Duration::from_secs(30),
        || {
            a.counter(
                "palisade_fence_rejections_total",
                &[("reason", "stale_token")],
            ) == 1
        },
    );
    // Give A's relay every chance to send something it should not.
    std::thread::sleep(Duration::from_millis(1500));

    let paid = psql(&format!(
        "SELECT count(*) FILTER (WHERE paid_at IS NOT NULL), max(paid_by_token) FROM {schema}.invoice"
    ));
    let fence = psql(&format!(
        "SELECT token FROM {schema}.fence WHERE scope = 'invoice:7'"
    ));
    assert_eq!(
        paid,
        format!("1|{fence}"),
        "paid once, by the newest holder"
    );
    assert_eq!(
        psql(&format!("SELECT count(*) FROM {schema}.outbox")),
        "1",
        "one receipt recorded"
    );
    let sent = keys.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "one receipt sent: {sent:?}");
    assert!(
        sent[0].starts_with("invoice:7/") && sent[0].ends_with("/settle/receipt"),
        "{sent:?}"
    );
    assert_eq!(
        a.counter("palisade_sink_writes_total", &[("outcome", "applied")]),
        0
    );
    assert_eq!(
        b.counter("palisade_sink_writes_total", &[("outcome", "applied")]),
        1
    );
    assert_eq!(
        b.counter("palisade_outbox_delivered_total", &[])
            + a.counter("palisade_outbox_delivered_total", &[]),
        1
    );

    // Load: the other invoices at once, from both workers.
    let jobs: String = (1..=INVOICES)
        .filter(|i| *i != 7)
        .map(|i| format!("{{\"invoice\":{i}}}\n"))
        .collect();
    let args = [
        "enqueue",
        invoice::SETTLE,
        "--stdin",
        "--scope",
        "invoice:{invoice}",
    ];
    palisade_testkit::process::run_with_stdin(BIN, &redis.url(), &args, &jobs);
    wait_for("every receipt sent", Duration::from_secs(90), || {
        keys.lock().unwrap().len() >= INVOICES as usize
    });
    std::thread::sleep(Duration::from_millis(1500));
    let paid = psql(&format!(
        "SELECT count(*) FILTER (WHERE paid_at IS NOT NULL) FROM {schema}.invoice"
    ));
    assert_eq!(paid, INVOICES.to_string(), "every invoice paid");
    let outbox = psql(&format!(
        "SELECT count(*), count(*) FILTER (WHERE state = 'delivered') FROM {schema}.outbox"
    ));
    assert_eq!(
        outbox,
        format!("{INVOICES}|{INVOICES}"),
        "a receipt each, delivered"
    );
    let mut sent = keys.lock().unwrap().clone();
    sent.sort();
    sent.dedup();
    assert_eq!(sent.len(), INVOICES as usize, "each receipt sent once");
    // Not one attempt failed on the way (a pooler's errors are retried: an outcome alone
    // would hide them).
    for (name, worker) in [("A", &a), ("B", &b)] {
        for outcome in ["retried", "dead", "timed_out"] {
            let n = worker.counter("palisade_jobs_finished_total", &[("outcome", outcome)]);
            assert_eq!(n, 0, "worker {name}: {n} attempts {outcome}");
        }
    }
    let status = invoice(&redis, &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["queues"]["default"]["dead"], 0, "{status}");
    assert_eq!(
        status["queues"]["default"]["completed"], INVOICES,
        "{status}"
    );
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}
