//! The `otel` feature in a program of its own: `Export` built inside a tokio runtime (as in a
//! `#[tokio::main]`), its layer in the program's subscriber, and which trace the jobs of an
//! enqueue continue. One global subscriber for the whole file, exporting to a real OTLP
//! receiver.
#![cfg(feature = "otel")]

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use palisade::{Client, LeaseStore, MemoryLeaseStore, NewJob, Stores, TraceContext};
use palisade_testkit::{wait_for, OtlpReceiver};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The environment is the process's: tests that read or change it take this first.
static ENV: Mutex<()> = Mutex::new(());

/// The receiver every span of this file goes to (the subscriber is installed once).
fn receiver() -> &'static OtlpReceiver {
    static RECEIVER: OnceLock<OtlpReceiver> = OnceLock::new();
    RECEIVER.get_or_init(|| {
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        let receiver = OtlpReceiver::start();
        std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "50");
        let export = palisade::otel::Export::from_env(Some(&receiver.endpoint()))
            .unwrap()
            .expect("an endpoint was given");
        tracing_subscriber::registry().with(export.layer()).init();
        // Kept for the life of the test process.
        Box::leak(Box::new(export));
        receiver
    })
}

fn trace(id: char) -> TraceContext {
    let hex: String = std::iter::repeat_n(id, 32).collect();
    TraceContext::from_w3c(&format!("00-{hex}-00f067aa0ba902b7-01"), None).unwrap()
}

async fn claimed_traces(store: &Stores, n: usize) -> Vec<(String, Option<TraceContext>)> {
    let claims = store
        .claim("default", "w", n, Duration::from_secs(30))
        .await
        .unwrap();
    let mut out: Vec<_> = claims
        .into_iter()
        .map(|c| (c.job.kind, c.job.trace))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A batch whose traced jobs share one trace: every job continues it, under the enqueue's
/// span. A batch naming two traces continues neither: those two keep theirs, the untraced job
/// gets a trace of its own (never another producer's).
#[tokio::test]
async fn an_enqueue_continues_the_trace_its_jobs_share_and_no_other() {
    let receiver = receiver();
    let store: Stores = std::sync::Arc::new(MemoryLeaseStore::new()).into();
    let client = Client::new(store.clone());
    client
        .enqueue_many(vec![
            NewJob::raw("a", "{}").with_trace(trace('a')),
            NewJob::raw("b", "{}"),
        ])
        .await
        .unwrap();
    let shared = claimed_traces(&store, 10).await;
    for (kind, t) in &shared {
        let t = t.as_ref().unwrap_or_else(|| panic!("{kind} has no trace"));
        assert_eq!(t.trace_id(), trace('a').trace_id(), "{kind}");
        // A child of the enqueue's span, not of the producer's.
        assert_ne!(t.span_id(), trace('a').span_id(), "{kind}");
    }
    client
        .enqueue_many(vec![
            NewJob::raw("c", "{}").with_trace(trace('c')),
            NewJob::raw("d", "{}"),
            NewJob::raw("e", "{}").with_trace(trace('e')),
        ])
        .await
        .unwrap();
    let mixed = claimed_traces(&store, 10).await;
    let id = |i: usize| mixed[i].1.as_ref().unwrap().trace_id().to_owned();
    assert_eq!(id(0), trace('c').trace_id());
    assert_eq!(id(2), trace('e').trace_id());
    assert_ne!(id(1), trace('c').trace_id());
    assert_ne!(id(1), trace('e').trace_id());
    // The enqueue span of the shared batch arrived, under the producer's span.
    wait_for("the enqueue span", Duration::from_secs(10), || {
        receiver
            .trace(trace('a').trace_id())
            .iter()
            .any(|s| s.name == "send default" && s.parent_span_id == trace('a').span_id())
    });
}

/// Settings the exporter cannot use are an error, not a panic, in a program's own runtime
/// (an exporter that fails to build after its runtime was made drops it without blocking).
#[tokio::test]
async fn bad_settings_are_an_error_inside_a_tokio_runtime() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "smoke-signals"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
    ] {
        std::env::set_var(var, value);
        let built = palisade::otel::Export::from_env(Some("http://127.0.0.1:9"));
        std::env::remove_var(var);
        let err = built.expect_err(var).to_string();
        assert!(
            err.contains(value) || err.contains("compression"),
            "{var}: {err}"
        );
    }
    let err = palisade::otel::Export::from_env(Some("http://127.0.0.1:9/v1/traces"))
        .expect_err("a signal path in the base URL")
        .to_string();
    assert!(err.contains("base URL"), "{err}");
    // Refused by the exporter's builder, after the exporter's runtime was made.
    let err = palisade::otel::Export::from_env(Some("http://bad host:4318"))
        .expect_err("a URL with a space")
        .to_string();
    assert!(err.contains("endpoint"), "{err}");
}

/// An enqueue inside the caller's span continues it. The exporter keeps spans of any crate a
/// handler uses but never its own stack's, by crate exactly (`tower_http` kept, `tonic` not).
#[tokio::test]
async fn an_enqueue_continues_the_callers_span_and_the_exporter_leaves_its_own_stack_out() {
    use tracing::Instrument as _;
    let receiver = receiver();
    let store: Stores = std::sync::Arc::new(MemoryLeaseStore::new()).into();
    let request = tracing::info_span!("incoming request");
    Client::new(store.clone())
        .enqueue(NewJob::raw("called", "{}"))
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    let trace = claimed_traces(&store, 1).await[0]
        .1
        .clone()
        .expect("the job continues the request's trace");
    for (target, name) in [
        ("tower_http::trace", "a handler's tower_http span"),
        ("towering", "a crate whose name starts like tower"),
        ("tonic::transport", "the exporter's tonic span"),
        ("h2::proto", "the exporter's h2 span"),
    ] {
        // (A span's target must be known when it is made: one callsite per target.)
        match target {
            "tower_http::trace" => {
                tracing::info_span!(target: "tower_http::trace", "s", otel.name = name)
            }
            "towering" => tracing::info_span!(target: "towering", "s", otel.name = name),
            "tonic::transport" => {
                tracing::info_span!(target: "tonic::transport", "s", otel.name = name)
            }
            _ => tracing::info_span!(target: "h2::proto", "s", otel.name = name),
        }
        .in_scope(|| {});
    }
    wait_for(
        "the request, its enqueue and the handler's spans",
        Duration::from_secs(10),
        || {
            let names: Vec<String> = receiver.spans().into_iter().map(|s| s.name).collect();
            let t = receiver.trace(trace.trace_id());
            t.iter().any(|s| s.name == "incoming request")
                && t.iter().any(|s| s.name == "send default")
                && names.iter().any(|n| n == "a handler's tower_http span")
                && names
                    .iter()
                    .any(|n| n == "a crate whose name starts like tower")
        },
    );
    let t = receiver.trace(trace.trace_id());
    let request = t.iter().find(|s| s.name == "incoming request").unwrap();
    let send = t.iter().find(|s| s.name == "send default").unwrap();
    assert_eq!(send.parent_span_id, request.span_id);
    std::thread::sleep(Duration::from_millis(300));
    let names: Vec<String> = receiver.spans().into_iter().map(|s| s.name).collect();
    assert!(
        !names.iter().any(|n| n.starts_with("the exporter's")),
        "{names:?}"
    );
}
