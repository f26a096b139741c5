//! OpenTelemetry traces end to end: real `palisade` processes export over OTLP/HTTP to a real
//! receiver that decodes the official protobuf types. One trace follows a job from the
//! producer's span through a holder SIGSTOPped past its lease, the reaper's stall record and
//! the re-run, to the holder's refused stale write with both tokens; an unsampled trace
//! exports nothing, yet its refusal is still logged with its trace id and journalled.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use palisade_testkit::{
    free_ports, http_get, wait_for, OtlpReceiver, Process, ReceivedSpan, RedisServer,
};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// The producer's own trace and span: the enqueue continues them.
const TRACE: &str = "5ca1ab1e00000000000000000000beef";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
/// A trace its producer did not sample (flags 00).
const QUIET: &str = "0af7651916cd43dd8448eb211c80319c";

/// The environment that makes a process export to `receiver` as `service`.
fn otel_env(receiver: &OtlpReceiver, service: &str) -> Vec<(String, String)> {
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()),
        ("OTEL_SERVICE_NAME", service.to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn log_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "palisade-otel-{}-{name}.log",
        uuid::Uuid::new_v4().simple()
    ))
}

fn worker(
    redis: &RedisServer,
    sink: &RedisServer,
    receiver: &OtlpReceiver,
    name: &str,
    log: &std::path::Path,
) -> Process {
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
        "--log-format",
        "json",
    ];
    let service = format!("worker-{}", name.to_lowercase());
    Process::worker_logging(BIN, &args, "warn", &otel_env(receiver, &service), log)
}

/// `palisade enqueue` of a deposit under `traceparent`, exporting its own span.
fn enqueue(redis: &RedisServer, receiver: &OtlpReceiver, account: u32, traceparent: &str) {
    let json = format!(r#"{{"account":{account},"cents":250,"hold_ms":1500}}"#);
    let scope = format!("account:{account}");
    succeeds(
        Command::new(BIN)
            .args(["enqueue", "ledger.deposit", &json, "--scope", &scope])
            .args(["--traceparent", traceparent])
            .env("PALISADE_REDIS_URL", redis.url())
            .envs(otel_env(receiver, "producer")),
    );
}

/// Runs `command`; panics with its stderr unless it succeeds.
fn succeeds(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn status(redis: &RedisServer) -> Value {
    let out = palisade_testkit::process::run(BIN, &redis.url(), &["status", "--json"]);
    serde_json::from_str(&out).unwrap()
}

fn one<'a>(
    spans: &'a [ReceivedSpan],
    what: &str,
    pick: impl Fn(&ReceivedSpan) -> bool,
) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| pick(s)).collect();
    assert_eq!(found.len(), 1, "one {what} in {spans:#?}");
    found[0]
}

/// Waits for trace `trace`'s enqueue and attempt on `queue` to arrive; returns them (one each).
fn send_and_process(
    receiver: &OtlpReceiver,
    trace: &str,
    queue: &str,
) -> (ReceivedSpan, ReceivedSpan) {
    let (send, process) = (format!("send {queue}"), format!("process {queue}"));
    wait_for(
        "the enqueue and the attempt",
        Duration::from_secs(20),
        || {
            let t = receiver.trace(trace);
            t.iter().any(|s| s.name == send) && t.iter().any(|s| s.name == process)
        },
    );
    let spans = receiver.trace(trace);
    (
        one(&spans, "enqueue", |s| s.name == send).clone(),
        one(&spans, "attempt", |s| s.name == process).clone(),
    )
}

#[test]
fn one_trace_follows_a_job_from_its_producer_through_a_paused_holder_to_its_refused_write() {
    let receiver = OtlpReceiver::start();
    let (redis, sink) = (RedisServer::start(), RedisServer::start());
    let (a_log, b_log) = (log_file("a"), log_file("b"));
    let a = worker(&redis, &sink, &receiver, "A", &a_log);
    enqueue(
        &redis,
        &receiver,
        7,
        &format!("00-{TRACE}-{PRODUCER_SPAN}-01"),
    );
    enqueue(
        &redis,
        &receiver,
        8,
        &format!("00-{QUIET}-{PRODUCER_SPAN}-00"),
    );
    wait_for("A to hold both jobs", Duration::from_secs(20), || {
        let leases = status(&redis)["leases"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        leases.len() == 2 && leases.iter().all(|l| l["worker"] == "A")
    });
    let leases = status(&redis)["leases"].as_array().cloned().unwrap();
    let a_lease = leases
        .iter()
        .find(|l| l["scope"] == "account:7")
        .unwrap()
        .clone();
    a.signal("-STOP");
    let stopped = Instant::now();
    let b = worker(&redis, &sink, &receiver, "B", &b_log);
    wait_for("B to complete both jobs", Duration::from_secs(30), || {
        status(&redis)["queues"]["default"]["completed"] == 2
    });
    std::thread::sleep(Duration::from_secs(2).saturating_sub(stopped.elapsed()));
    a.signal("-CONT");
    wait_for(
        "A's stale writes to be refused",
        Duration::from_secs(30),
        || {
            a.counter(
                "palisade_fence_rejections_total",
                &[("reason", "stale_token")],
            ) == 2
        },
    );
    // Both processes stop cleanly, sending what they still hold.
    a.terminate_cleanly();
    b.terminate_cleanly();

    let b_token: u64 = sink
        .cli(&["GET", "palisade-ledger:{account:7}:fence"])
        .unwrap()
        .split('\t')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let a_token = a_lease["token"].as_u64().unwrap();
    assert!(b_token > a_token);

    wait_for(
        "the whole trace at the receiver",
        Duration::from_secs(20),
        || {
            let t = receiver.trace(TRACE);
            t.iter().filter(|s| s.name == "process default").count() == 2
                && t.iter().any(|s| s.name == "palisade.stall")
                && t.iter()
                    .filter(|s| s.name == "palisade.fenced_write")
                    .count()
                    == 2
                && t.iter().any(|s| s.name == "send default")
        },
    );
    let spans = receiver.trace(TRACE);
    // The enqueue continues the producer's span.
    let enqueue = one(&spans, "enqueue", |s| s.name == "send default");
    assert_eq!(
        (
            enqueue.service.as_str(),
            enqueue.parent_span_id.as_str(),
            enqueue.kind
        ),
        ("producer", PRODUCER_SPAN, 4),
        "{enqueue:#?}"
    );
    assert_eq!(enqueue.attr("messaging.destination.name"), "default");
    // Each attempt is a consumer span under the enqueue, saying where it ran and with what.
    let first = one(&spans, "first attempt", |s| {
        s.name == "process default" && s.attr("palisade.job.attempt") == "1"
    });
    let rerun = one(&spans, "re-run", |s| {
        s.name == "process default" && s.attr("palisade.job.attempt") == "2"
    });
    for (attempt, worker, service) in [(first, "A", "worker-a"), (rerun, "B", "worker-b")] {
        assert_eq!(attempt.parent_span_id, enqueue.span_id, "{attempt:#?}");
        assert_eq!(attempt.kind, 5, "a consumer span: {attempt:#?}");
        assert_eq!(attempt.attr("messaging.operation.type"), "process");
        assert_eq!(
            (attempt.service.as_str(), attempt.attr("palisade.worker")),
            (service, worker)
        );
        assert_eq!(attempt.attr("messaging.system"), "palisade");
        assert_eq!(attempt.attr("palisade.scope"), "account:7");
        assert_eq!(attempt.attr("palisade.job.kind"), "ledger.deposit");
    }
    assert_eq!(first.attr("palisade.fencing_token"), a_token.to_string());
    assert_eq!(
        first.attr("palisade.lease_id"),
        a_lease["lease"].as_str().unwrap()
    );
    assert_eq!(first.attr("palisade.outcome"), "fenced");
    assert_eq!(
        first.status, 2,
        "the fenced attempt is an error: {first:#?}"
    );
    assert_eq!(rerun.attr("palisade.fencing_token"), b_token.to_string());
    assert_eq!(rerun.attr("palisade.outcome"), "ok");
    assert_eq!(rerun.attr("palisade.job.stalls"), "1");
    // The reaper recorded the stall of A's lease in the job's trace.
    let stall = one(&spans, "stall", |s| s.name == "palisade.stall");
    assert_eq!(stall.parent_span_id, enqueue.span_id);
    assert_eq!(
        stall.attr("palisade.lease_id"),
        a_lease["lease"].as_str().unwrap()
    );
    assert_eq!(stall.attr("palisade.fencing_token"), a_token.to_string());
    assert_eq!(stall.attr("palisade.worker"), "A");
    assert_eq!(stall.attr("palisade.outcome"), "requeued");
    // A's write, inside its attempt, was refused with both tokens; B's was applied.
    let refused = one(&spans, "refused write", |s| {
        s.name == "palisade.fenced_write" && s.attr("palisade.outcome") == "refused"
    });
    assert_eq!(refused.parent_span_id, first.span_id);
    assert_eq!(refused.attr("palisade.rejection"), "stale_token");
    assert_eq!(refused.attr("palisade.fencing_token"), a_token.to_string());
    assert_eq!(refused.attr("palisade.highest_token"), b_token.to_string());
    assert_eq!(refused.attr("palisade.sink"), "ledger");
    assert_eq!(refused.status, 2);
    let applied = one(&spans, "applied write", |s| {
        s.name == "palisade.fenced_write" && s.attr("palisade.outcome") == "applied"
    });
    assert_eq!(applied.parent_span_id, rerun.span_id);

    // The unsampled trace exported nothing — but its refusal is not lost: A logged it with
    // its trace id, and the rejection journal keeps the trace id of both.
    assert!(
        receiver.trace(QUIET).is_empty(),
        "{:#?}",
        receiver.trace(QUIET)
    );
    let log = std::fs::read_to_string(&a_log).unwrap();
    let refusals: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("fenced write refused"))
        })
        .collect();
    let logged: Vec<&str> = refusals
        .iter()
        .filter_map(|l| l["fields"]["trace_id"].as_str())
        .collect();
    assert!(logged.contains(&QUIET) && logged.contains(&TRACE), "{log}");
    // The log line sits in the attempt's span, which names the job and the trace.
    let quiet = refusals
        .iter()
        .find(|l| l["fields"]["trace_id"] == QUIET)
        .unwrap();
    let attempt = quiet["spans"]
        .as_array()
        .and_then(|spans| spans.iter().find(|s| s["name"] == "palisade.job"))
        .unwrap_or_else(|| panic!("the refusal is logged inside its attempt: {quiet}"));
    assert_eq!(attempt["trace_id"], QUIET, "{quiet}");
    assert_eq!(attempt["palisade.scope"], "account:8", "{quiet}");
    let journal = redis
        .cli(&["LRANGE", "{palisade}:rejections", "0", "-1"])
        .unwrap_or_default();
    assert!(
        journal.contains(QUIET) && journal.contains(TRACE),
        "journal: {journal}"
    );
    let _ = std::fs::remove_file(a_log);
    let _ = std::fs::remove_file(b_log);
}

/// A producer in another language (Python, a hand-built `traceparent`, no SDK) enqueues
/// through the HTTP API; the API's enqueue span and the Rust worker's attempt continue its
/// trace.
#[test]
fn a_python_producers_trace_continues_into_the_rust_worker() {
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let url = redis.url();
    let _worker = Process::worker_with_env(
        BIN,
        &["--redis", &url, "--queues", "polyglot"],
        "warn",
        &otel_env(&receiver, "worker"),
    );
    let [port] = free_ports();
    let listen = format!("127.0.0.1:{port}");
    let _api = Process::spawn_with_env(
        BIN,
        &["api", "--redis", &url, "--listen", &listen],
        "warn",
        &otel_env(&receiver, "api"),
    );
    wait_for("the API to serve", Duration::from_secs(20), || {
        http_get(port, "/healthz").is_some()
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/traced_producer.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .env("PALISADE_API", format!("http://{listen}"))
        .output()
        .expect("python3 is installed");
    assert!(
        out.status.success(),
        "the Python producer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (trace, parent) = (
        said["trace_id"].as_str().unwrap(),
        said["span_id"].as_str().unwrap(),
    );
    let (send, process) = send_and_process(&receiver, trace, "polyglot");
    assert_eq!(
        (send.service.as_str(), send.parent_span_id.as_str()),
        ("api", parent)
    );
    assert_eq!(process.service, "worker");
    assert_eq!(process.parent_span_id, send.span_id);
    assert_eq!(
        process.attr("messaging.message.id"),
        said["job"].as_str().unwrap()
    );
    assert_eq!(process.attr("palisade.outcome"), "ok");
}

/// OTLP over gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`), the endpoint given by
/// `--otlp-endpoint`: the enqueue and the attempt arrive, in the producer's trace.
#[test]
fn traces_go_out_over_grpc_to_the_endpoint_the_flag_names() {
    let receiver = OtlpReceiver::start_grpc();
    let redis = RedisServer::start();
    let url = redis.url();
    let endpoint = receiver.endpoint();
    let env: Vec<(String, String)> = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_SERVICE_NAME", "grpc-worker"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let worker = Process::worker_with_env(
        BIN,
        &["--redis", &url, "--otlp-endpoint", &endpoint],
        "warn",
        &env,
    );
    let trace = "1234567890abcdef1234567890abcdef";
    succeeds(
        Command::new(BIN)
            .args(["enqueue", "report.part", r#"{"n":3}"#])
            .args(["--otlp-endpoint", &endpoint])
            .env("PALISADE_REDIS_URL", &url)
            .env("TRACEPARENT", format!("00-{trace}-{PRODUCER_SPAN}-01"))
            .envs(env.iter().map(|(k, v)| (k, v))),
    );
    let (send, process) = send_and_process(&receiver, trace, "default");
    assert_eq!(send.parent_span_id, PRODUCER_SPAN);
    assert_eq!(process.parent_span_id, send.span_id);
    assert_eq!(process.service, "grpc-worker");
    worker.terminate_cleanly();
}

/// Bad export settings are refused before anything runs, with the setting named; an
/// exporter that is not built in is warned of and left out (the command goes on: here, to
/// its own error about the unreachable Redis).
#[test]
fn a_bad_export_setting_is_a_clear_error() {
    for (var, value, says) in [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "carrier-pigeon",
            "carrier-pigeon",
        ),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "lz4", "gzip or none"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "milliseconds"),
        ("OTEL_TRACES_EXPORTER", "zipkin", "only otlp is built in"),
    ] {
        let out = Command::new(BIN)
            .args(["status", "--otlp-endpoint", "http://127.0.0.1:9"])
            .env("PALISADE_REDIS_URL", "redis://127.0.0.1:9")
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {stderr}");
        assert!(stderr.contains(says), "{var}={value}: {stderr}");
    }
}

/// A collector that accepts an export and never answers costs that export only: it times out
/// (`OTEL_EXPORTER_OTLP_TIMEOUT`), the failure is logged, and later spans arrive.
#[test]
fn a_hung_collector_loses_one_export_not_the_rest() {
    let receiver = OtlpReceiver::start_hanging_first();
    let redis = RedisServer::start();
    let url = redis.url();
    let log = log_file("hung");
    let mut env = otel_env(&receiver, "worker");
    env.push(("OTEL_EXPORTER_OTLP_TIMEOUT".into(), "500".into()));
    let worker = Process::worker_logging(BIN, &["--redis", &url], "warn", &env, &log);
    let enqueue = |trace: &str| {
        succeeds(
            Command::new(BIN)
                .args(["enqueue", "report.part", r#"{"n":1}"#])
                .args(["--traceparent", &format!("00-{trace}-{PRODUCER_SPAN}-01")])
                .env("PALISADE_REDIS_URL", &url),
        );
    };
    let (first, second) = (
        "11111111111111111111111111111111",
        "22222222222222222222222222222222",
    );
    enqueue(first);
    wait_for("the first export to fail", Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("OTLP export failed"))
    });
    enqueue(second);
    wait_for(
        "the second job's attempt at the receiver",
        Duration::from_secs(20),
        || {
            receiver
                .trace(second)
                .iter()
                .any(|s| s.name == "process default")
        },
    );
    assert!(receiver.trace(first).is_empty(), "the hung export was kept");
    worker.terminate_cleanly();
    let _ = std::fs::remove_file(log);
}
