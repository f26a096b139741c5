//! The fenced outbox with real parts: effects recorded by fenced transactions in the real
//! PostgreSQL, a real `palisade relay` process that is kill -9'd mid-delivery and restarted,
//! and a local HTTP receiver that fails some requests and counts deliveries per
//! `Idempotency-Key`. Every effect of a current generation arrives (at least once, with a
//! stable key); none of a stale generation is ever recorded, so none is sent.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade::{Fence, Fenced, FencingToken, IdempotencyKey, LeaseId, PostgresSink, Scope};
use palisade_testkit::{http_receiver, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A receiver that answers every third request 503 (so the relay must retry) and the others
/// 200, recording the `Idempotency-Key` and body of each successful POST.
struct Receiver {
    port: u16,
    delivered: Arc<Mutex<Vec<(String, String)>>>,
}

impl Receiver {
    fn start() -> Self {
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let seen = delivered.clone();
        let port = http_receiver(move |request| {
            if (request.number + 1).is_multiple_of(3) {
                return "503 Service Unavailable";
            }
            let key = request.key.unwrap_or_else(|| "<missing>".into());
            seen.lock().unwrap().push((key, request.body));
            "200 OK"
        });
        Self { port, delivered }
    }

    fn by_key(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for (key, _) in self.delivered.lock().unwrap().iter() {
            *counts.entry(key.clone()).or_default() += 1;
        }
        counts
    }
}

struct Relay(Child);

impl Relay {
    fn start(sink_url: &str, receiver: &Receiver) -> Self {
        Self(
            Command::new(BIN)
                // The relay needs the coordinator only for queue: targets; this one has none.
                .args(["relay", "--redis", "redis://127.0.0.1:1"])
                .args(["--sink", &format!("ledger={sink_url}")])
                .args([
                    "--target",
                    &format!("email=http://127.0.0.1:{}/hooks/email", receiver.port),
                ])
                .args(["--outbox-lease", "2s", "--outbox-backoff", "20ms"])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("palisade binary runs"),
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fence(token: u64) -> Fence {
    Fence {
        token: FencingToken::from_u64(token),
        lease: LeaseId::from(uuid::Uuid::from_u128(u128::from(token))),
    }
}

/// One job run: a fenced transaction that pushes `effects` receipts.
async fn run_job(
    sink: &PostgresSink,
    scope: &str,
    token: u64,
    job: &str,
    effects: u32,
) -> Fenced<()> {
    sink.transaction(
        &Scope::new(scope),
        fence(token),
        &IdempotencyKey::new(format!("{job}/settle")),
        move |tx| {
            Box::pin(async move {
                for e in 0..effects {
                    tx.outbox("email").push(&format!("receipt{e}"), &e).await?;
                }
                Ok(())
            })
        },
    )
    .await
    .unwrap()
}

/// A runtime and a Postgres sink in a schema of this test's own (with its name and URL).
fn fresh_sink() -> (tokio::runtime::Runtime, PostgresSink, String, String) {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let base = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let url = format!("{base}?schema={schema}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sink = rt
        .block_on(PostgresSink::connect(&url))
        .expect("PostgreSQL is running (.ci/run starts it)");
    (rt, sink, schema, url)
}

#[test]
fn a_killed_relay_resumes_and_only_current_effects_are_sent() {
    let (rt, sink, schema, url) = fresh_sink();
    let mut current = 0;
    rt.block_on(async {
        for i in 0..60u64 {
            let scope = format!("invoice:{i}");
            // The current generation (token 1000+i) settles the invoice with 3 receipts...
            assert_eq!(
                run_job(&sink, &scope, 1000 + i, &format!("job{i}"), 3).await,
                Fenced::Applied(())
            );
            current += 3;
            // ...then the stale one (paused holder, token i) wakes and tries: refused, and
            // its receipt is never recorded.
            let stale = run_job(&sink, &scope, i, &format!("stale{i}"), 1).await;
            assert!(matches!(stale, Fenced::Rejected(_)), "{stale:?}");
            // A re-run of the current job repeats its pushes: a duplicate, nothing new.
            let rerun = run_job(&sink, &scope, 2000 + i, &format!("job{i}"), 3).await;
            assert_eq!(rerun, Fenced::Duplicate(()));
        }
    });
    assert_eq!(
        rt.block_on(sink.outbox_counts()).unwrap().pending,
        current as u64
    );

    let receiver = Receiver::start();
    let relay = Relay::start(&url, &receiver);
    wait_for("some deliveries", Duration::from_secs(30), || {
        receiver.delivered.lock().unwrap().len() >= 30
    });
    drop(relay); // kill -9 (Child::kill is SIGKILL), mid-delivery
    let _relay = Relay::start(&url, &receiver);
    wait_for("every entry delivered", Duration::from_secs(60), || {
        rt.block_on(sink.outbox_counts()).unwrap().pending == 0
    });
    let counts = rt.block_on(sink.outbox_counts()).unwrap();
    assert_eq!((counts.delivered, counts.dead), (current as u64, 0));
    let by_key = receiver.by_key();
    assert_eq!(
        by_key.len(),
        current,
        "every current effect arrived: {by_key:?}"
    );
    for key in by_key.keys() {
        // invoice:<i>/job<i>/settle/receipt<e>: stable per effect, never a stale one.
        assert!(key.starts_with("invoice:") && key.contains("/job"), "{key}");
        assert!(
            !key.contains("stale"),
            "a stale generation's effect was sent: {key}"
        );
    }
    assert!(
        receiver
            .delivered
            .lock()
            .unwrap()
            .iter()
            .all(|(_, body)| body.parse::<u32>().is_ok()),
        "bodies are the pushed JSON payloads"
    );
    let client = rt.block_on(sink.pool().get()).unwrap();
    rt.block_on(client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))
        .unwrap();
}

#[test]
fn operators_list_and_retry_dead_outbox_entries() {
    let (rt, sink, schema, url) = fresh_sink();
    assert_eq!(
        rt.block_on(run_job(&sink, "invoice:1", 5, "job1", 2)),
        Fenced::Applied(())
    );
    let client = rt.block_on(sink.pool().get()).unwrap();
    rt.block_on(client.batch_execute(&format!(
        "UPDATE {schema}.outbox SET state = 'dead', attempts = 12, last_error = 'receiver said 410' \
         WHERE key LIKE '%receipt0'"
    )))
    .unwrap();
    let palisade = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let sink_flag = format!("ledger={url}");
    let listed = palisade(&["outbox", "list", "--sink", &sink_flag]);
    assert!(
        listed.contains("pending 1, delivered 0, dead 1"),
        "{listed}"
    );
    assert!(
        listed.contains("after 12 attempts: receiver said 410"),
        "{listed}"
    );
    let retried = palisade(&["outbox", "retry", "--sink", &sink_flag]);
    assert!(
        retried.contains("1 dead entries pending again"),
        "{retried}"
    );
    assert_eq!(rt.block_on(sink.outbox_counts()).unwrap().pending, 2);
    let none = Command::new(BIN)
        .args(["outbox", "list"])
        .env_remove("PALISADE_SINK_LEDGER_URL")
        .output()
        .unwrap();
    assert_eq!(
        none.status.code(),
        Some(2),
        "no Postgres sink is a clear error"
    );
    rt.block_on(client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))
        .unwrap();
}

/// Issue 55: Postgres migrations an operator controls. A worker started with `--no-migrate`
/// on a schema that lacks them refuses, exit code 2, naming the command; `migrate --plan`
/// prints the SQL and changes nothing; `migrate --apply` applies it; then the worker starts.
#[test]
fn migrations_are_planned_and_applied_by_the_operator() {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let base = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let sink_flag = format!("ledger={base}?schema={schema}");
    let palisade = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();
    let redis = palisade_testkit::RedisServer::start();
    let worker = [
        "worker",
        "--redis",
        &redis.url(),
        "--sink",
        &sink_flag,
        "--no-migrate",
    ];
    let refused = palisade(&worker);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(said.contains("palisade migrate --apply"), "{said}");

    let plan = palisade(&["migrate", "--plan", "--sink", &sink_flag]);
    assert!(plan.status.success());
    let text = String::from_utf8(plan.stdout).unwrap();
    assert!(
        text.starts_with(&format!(
            "sink ledger: schema \"{schema}\" at version 0, this binary knows 2: 2 to apply"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("CREATE TABLE \"{schema}\".fence")),
        "{text}"
    );
    assert!(
        text.contains("-- version 2 (binaries from version 1 on run against it)"),
        "{text}"
    );
    // Twice the same: the plan changed nothing.
    let again = palisade(&["migrate", "--plan", "--sink", &sink_flag]);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), text);

    let applied = palisade(&["migrate", "--apply", "--sink", &sink_flag]);
    let said = String::from_utf8(applied.stdout).unwrap();
    assert_eq!(
        said.trim(),
        format!("sink ledger: schema \"{schema}\" from version 0 to 2")
    );
    let plan = palisade(&["migrate", "--plan", "--sink", &sink_flag]);
    let text = String::from_utf8(plan.stdout).unwrap();
    assert_eq!(
        text.trim(),
        format!("sink ledger: schema \"{schema}\" at version 2, this binary knows 2: up to date")
    );
    // Neither or both of --plan and --apply: a usage error.
    assert_eq!(
        palisade(&["migrate", "--sink", &sink_flag]).status.code(),
        Some(2)
    );

    let mut args = worker.to_vec();
    args.extend(["--name", "migrated"]);
    let w = palisade_testkit::Process::worker(BIN, &args[1..], "warn");
    w.terminate_cleanly();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sink = rt
        .block_on(PostgresSink::connect(&format!("{base}?schema={schema}")))
        .unwrap();
    let client = rt.block_on(sink.pool().get()).unwrap();
    rt.block_on(client.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")))
        .unwrap();
}
