//! The stale-holder scenario with the Postgres sink and the outbox, with real parts: the
//! example's own worker binary (two processes, each with its outbox relay) on a private Redis,
//! the real PostgreSQL, and a local HTTP receiver for receipts. Worker A claims the invoice
//! and is SIGSTOPped past its lease; B settles it and its relay sends the receipt; A wakes
//! and runs the same job body — its transaction is refused before its SQL runs. The invoice
//! is paid once, by B's token, and exactly one receipt is recorded and sent.

#[path = "../../../jobs/tests/common/mod.rs"]
mod common;
#[path = "../../../runtime/tests/common/mod.rs"]
mod redis_server;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, http_get, http_receiver, wait_for};
use redis_server::RedisServer;

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

struct Worker {
    child: Child,
    port: u16,
}

impl Worker {
    fn start(redis: &RedisServer, sink: &str, receipts: u16, name: &str) -> Self {
        let port = free_port();
        let child = Command::new(BIN)
            .args(["worker", "--redis", &redis.url(), "--name", name])
            .args(["--lease", "1s", "--arbiters", "1", "--concurrency", "4"])
            .args(["--sink", &format!("billing={sink}")])
            .args([
                "--relay",
                "--target",
                &format!("email=http://127.0.0.1:{receipts}/receipts"),
            ])
            .args(["--metrics", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let worker = Self { child, port };
        wait_for("worker up", Duration::from_secs(20), || {
            http_get(worker.port, "/metrics").is_some()
        });
        worker
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        palisade::metrics::sample_sum(
            &http_get(self.port, "/metrics").unwrap_or_default(),
            name,
            labels,
        )
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let redis = RedisServer::start();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let base = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    // The sink's tables and the user's `invoice` table in one schema of this test's own.
    let sink = format!("{base}?schema={schema}&options=-csearch_path%3D{schema}");
    invoice(&redis, &["setup", "--database", &sink, "--invoices", "10"]);
    let (receipts, keys) = receiver();

    let a = Worker::start(&redis, &sink, receipts, "A");
    let job = r#"{"invoice": 7, "hold_ms": 1500}"#;
    invoice(
        &redis,
        &["enqueue", invoice::SETTLE, job, "--scope", "invoice:7"],
    );
    wait_for("A to hold the invoice", Duration::from_secs(20), || {
        invoice(&redis, &["status", "--json", "--scope", "invoice:7"]).contains("\"worker\":\"A\"")
    });
    a.signal("-STOP");
    let stopped = Instant::now();
    let b = Worker::start(&redis, &sink, receipts, "B");
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
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}
