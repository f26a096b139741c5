//! The Prometheus exporter: `/metrics`, `/healthz` and `/readyz` on a thread of their own
//! (re-exported as `metrics::serve`; the metric names are `metrics`').

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::error::{Error, Result};
use crate::metrics::{describe, SECONDS_BUCKETS};

/// Readiness of a process, as `/readyz` reports it: ready while its backends answer and it
/// is not draining. Cheap to clone; every clone sees the same state.
#[derive(Clone, Debug)]
pub struct Health(Arc<AtomicBool>);

impl Health {
    /// Starts not ready (a worker reports ready once its backend has answered).
    pub fn new() -> Self {
        Self(Arc::new(AtomicBool::new(false)))
    }

    /// Sets readiness.
    pub fn set_ready(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Current readiness.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// A gauge not set for this long leaves the output (three missed samples and then some).
const GAUGE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Installs the global Prometheus recorder (histograms ending in `_seconds` get
/// [`SECONDS_BUCKETS`]; a gauge not set for 30 s leaves the output, so a sampler that lost its
/// role stops showing a stale depth — set your own gauges at least that often) and serves `/metrics` on `addr` from a thread of
/// its own, so a busy or paused worker arbiter cannot starve scrapes; `/healthz` answers 200
/// while the process runs, `/readyz` 200 or 503 from a [`Health`] that is always ready.
/// Returns a handle that renders the same text in-process.
///
/// Call it once per process. Fails if `addr` cannot be bound or a recorder is already set.
pub fn serve_prometheus(addr: SocketAddr) -> Result<PrometheusHandle> {
    let health = Health::new();
    health.set_ready(true);
    serve(addr, health)
}

/// [`serve_prometheus`] with `/readyz` answering from `health`.
pub fn serve(addr: SocketAddr, health: Health) -> Result<PrometheusHandle> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Config(format!("metrics listener on {addr}: {e}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(&e))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| fail(&e))?;
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .map_err(|e| fail(&e))?
        // A sampler that lost its role stops updating its gauges; they leave the output
        // instead of showing a stale depth beside the new sampler's.
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| fail(&e))?;
    let served = handle.clone();
    std::thread::Builder::new()
        .name("palisade-metrics".into())
        .spawn(move || runtime.block_on(listen(listener, served, health)))
        .map_err(|e| fail(&e))?;
    describe();
    Ok(handle)
}

/// Answers `/metrics`, `/healthz` and `/readyz` until the process exits, and runs the
/// recorder's upkeep (histogram maintenance) between scrapes.
async fn listen(listener: tokio::net::TcpListener, handle: PrometheusHandle, health: Health) {
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    // A scraper, a probe and a person: a few connections at once, each sending its request
    // head within the timeout and taking its answer within it. A client that does neither is
    // cut off, and one past the cap closed at once, so nobody can hold the process's file
    // descriptors through this port (issue 58).
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                crate::cli_support::warn_repeated!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let (handle, health) = (handle.clone(), health.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = route(request.uri().path(), &handle, &health);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(crate::write_deadline::WriteDeadline::new(
                stream, TIMEOUT,
            ));
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(TIMEOUT)
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Connections the metrics port serves at once.
const MAX_CONNECTIONS: usize = 64;

/// Longest a metrics client may take to send its request head, or to take its answer.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn route(path: &str, handle: &PrometheusHandle, health: &Health) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, handle.render()),
        "/healthz" => (StatusCode::OK, "ok\n".to_owned()),
        "/readyz" if health.is_ready() => (StatusCode::OK, "ready\n".to_owned()),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
    };
    let content_type = if path == "/metrics" {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
