//! OpenTelemetry export (feature `otel`): the runtime's `tracing` spans continue each job's
//! trace and go out over OTLP.
//!
//! [`Export::from_env`] reads the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or an endpoint given in code, `--otlp-endpoint`),
//! `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` (`http/protobuf`, the default; `http/json`; `grpc`),
//! `_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` / `_ARG`, `OTEL_BSP_*`, and `OTEL_SDK_DISABLED` /
//! `OTEL_TRACES_EXPORTER=none` to turn it off. `palisade_cli::App` does this for every
//! subcommand; a program of its own adds [`Export::layer`] to its subscriber.
//!
//! Spans are sent by the SDK's batch processor on a thread of its own, through an exporter that
//! runs on a small tokio runtime of its own: the actors' runtime never waits for a collector.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::error::{Error, Result};
use crate::traceparent::TraceContext;

/// Makes `span` a child of `trace` (when a tracer is installed; otherwise it changes nothing).
/// Must run before the span is first entered.
pub(crate) fn continue_trace(span: &Span, trace: Option<&TraceContext>) {
    if let Some(trace) = trace {
        let _ = span.set_parent(context(trace));
    }
}

/// The OpenTelemetry context `trace` names (a remote parent).
fn context(trace: &TraceContext) -> opentelemetry::Context {
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_owned(), trace.traceparent().to_owned());
    if let Some(state) = trace.tracestate() {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// `span`'s own W3C context, if a tracer gave it one (not for a span no layer records).
pub(crate) fn context_of(span: &Span) -> Option<TraceContext> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    TraceContext::from_w3c(
        carrier.get("traceparent")?,
        carrier.get("tracestate").map(String::as_str),
    )
}

/// See [`crate::trace::enqueue_span`].
pub(crate) fn enqueue_span(jobs: &mut [crate::job::NewJob]) -> Span {
    let queue = jobs.first().map_or("", |j| j.queue.as_str());
    let span = tracing::info_span!(
        target: "palisade::enqueue",
        "palisade.enqueue",
        otel.name = %format_args!("send {queue}"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        messaging.system = "palisade",
        messaging.operation.type = "send",
        messaging.destination.name = queue,
        messaging.batch.message_count = jobs.len(),
    );
    // The parent: the caller's span; with none, the trace every job that names one names (a
    // batch whose jobs name different traces continues none of them: those keep their own).
    let parent = if context_of(&Span::current()).is_some() {
        None
    } else {
        let mut given = jobs.iter().filter_map(|j| j.trace.as_ref());
        let first = given.next().cloned();
        let shared = first.filter(|f| given.all(|t| t == f));
        continue_trace(&span, shared.as_ref());
        shared
    };
    if let Some(mine) = context_of(&span) {
        for job in jobs.iter_mut() {
            if job.trace.is_none() || job.trace == parent {
                job.trace = Some(mine.clone());
            }
        }
    }
    span
}

/// The longest a process waits at exit for its last spans to be sent.
pub const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Exports the spans of this process over OTLP until dropped (which sends what is left,
/// waiting at most [`SHUTDOWN_WAIT`]).
pub struct Export {
    provider: SdkTracerProvider,
    /// Runs the exporter's I/O (tonic's channel, reqwest's connections).
    runtime: OwnRuntime,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").finish_non_exhaustive()
    }
}

/// The exporter's runtime, stopped without blocking when dropped: `Export` may be built and
/// dropped inside another runtime (a program's `#[tokio::main]`), where dropping a runtime
/// the ordinary way panics.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The value of the first of `names` that is set and not empty.
fn var(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
}

/// How long one export may take: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` /
/// `OTEL_EXPORTER_OTLP_TIMEOUT` (ms), 10 s by default as the specification says.
fn export_timeout() -> Result<std::time::Duration> {
    match var(&[
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]) {
        None => Ok(std::time::Duration::from_secs(10)),
        Some(ms) => ms
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis)
            .ok_or_else(|| {
                Error::Config(format!(
                    "OTEL_EXPORTER_OTLP_TIMEOUT={ms:?}: a whole number of milliseconds above 0"
                ))
            }),
    }
}

impl Export {
    /// An exporter as the standard variables say, `endpoint` (a base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) overriding theirs. `Ok(None)` when nothing asks for export
    /// (no endpoint given or set and `OTEL_TRACES_EXPORTER` not naming `otlp`) or it is turned
    /// off (`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER` naming only `none` or exporters
    /// not built in, which are warned of); `Error::Config` for a protocol, endpoint, timeout or
    /// compression that cannot be used.
    pub fn from_env(endpoint: Option<&str>) -> Result<Option<Self>> {
        let disabled = var(&["OTEL_SDK_DISABLED"]).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        // A comma-separated list, as the specification has it: otlp is the one exporter here.
        let exporters: Vec<String> = var(&["OTEL_TRACES_EXPORTER"])
            .unwrap_or_default()
            .split(',')
            .map(|e| e.trim().to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .collect();
        let otlp = exporters.iter().any(|e| e == "otlp");
        if disabled || (!exporters.is_empty() && !otlp) {
            for other in exporters.iter().filter(|e| *e != "none") {
                eprintln!(
                    "warning: OTEL_TRACES_EXPORTER names {other:?}; only otlp is built in: \
                     it is left out"
                );
            }
            return Ok(None);
        }
        let endpoint = endpoint.map(str::trim).filter(|e| !e.is_empty());
        let asked = endpoint.is_some()
            || otlp
            || var(&[
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ])
            .is_some();
        if !asked {
            return Ok(None);
        }
        let protocol = var(&[
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ])
        .map_or_else(|| "http/protobuf".into(), |p| p.trim().to_ascii_lowercase());
        if !matches!(protocol.as_str(), "grpc" | "http/protobuf" | "http/json") {
            return Err(Error::Config(format!(
                "OTLP protocol {protocol:?}: use grpc, http/protobuf or http/json"
            )));
        }
        if let Some(endpoint) = endpoint {
            if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
                return Err(Error::Config(format!(
                    "--otlp-endpoint {endpoint}: give the collector's base URL (as \
                     OTEL_EXPORTER_OTLP_ENDPOINT); /v1/traces is added"
                )));
            }
        }
        // (The exporter would ignore a value it cannot use, in silence.)
        if let Some(c) = var(&[
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ]) {
            if !matches!(c.trim().to_ascii_lowercase().as_str(), "gzip" | "none") {
                return Err(Error::Config(format!(
                    "OTEL_EXPORTER_OTLP_COMPRESSION={c:?}: gzip or none"
                )));
            }
        }
        let timeout = export_timeout()?;
        let runtime = OwnRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("palisade-otlp")
                .enable_all()
                .build()
                .map_err(|e| Error::Config(format!("OTLP exporter runtime: {e}")))?,
        ));
        let handle = runtime.0.as_ref().expect("just built").handle().clone();
        let bad = |e: opentelemetry_otlp::ExporterBuildError| {
            Error::Config(format!("OTLP exporter ({protocol}): {e}"))
        };
        let exporter = if protocol == "grpc" {
            // tonic's channel spawns its worker where it is built: on our runtime.
            let _inside = handle.enter();
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_timeout(timeout);
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder.build().map_err(bad)?
        } else {
            let client = HttpOnRuntime::new(handle, timeout)?;
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_timeout(timeout)
                .with_protocol(if protocol == "http/json" {
                    opentelemetry_otlp::Protocol::HttpJson
                } else {
                    opentelemetry_otlp::Protocol::HttpBinary
                });
            if let Some(endpoint) = endpoint {
                // As OTEL_EXPORTER_OTLP_ENDPOINT: a base URL the signal's path goes under.
                builder =
                    builder.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
            }
            builder.build().map_err(bad)?
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Said::new(exporter, &protocol))
            .with_resource(resource())
            .build();
        Ok(Some(Export { provider, runtime }))
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans for this exporter: at
    /// info and above, never the exporter's own HTTP and gRPC stack (its spans, exported,
    /// would make more to export).
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        const QUIET: [&str; 10] = [
            "h2",
            "hyper",
            "hyper_util",
            "tonic",
            "tower",
            "reqwest",
            "opentelemetry",
            "opentelemetry_sdk",
            "opentelemetry_otlp",
            "opentelemetry_http",
        ];
        // By crate, exactly: `tower` is the exporter's, `tower_http` a handler's.
        let ours = |target: &str| {
            QUIET.iter().any(|q| {
                target
                    .strip_prefix(q)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
            })
        };
        let filter = tracing_subscriber::filter::filter_fn(move |meta| {
            *meta.level() <= tracing::Level::INFO && !ours(meta.target())
        });
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("palisade"))
            .with_tracked_inactivity(false)
            .with_filter(filter)
    }

    /// Sends what is left and stops (also on drop).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(runtime) = self.runtime.0.take() else {
            return;
        };
        // Bounded: a command must not hang at exit on a collector that does not answer.
        match self.provider.shutdown_with_timeout(SHUTDOWN_WAIT) {
            Ok(()) => runtime.shutdown_background(),
            Err(e) => {
                eprintln!("palisade: OTLP export did not finish: {e}");
                // The batch thread may still be inside an export that needs this runtime's
                // timers; stopping it under that thread would panic there. The process is
                // leaving: let the runtime go with it.
                std::mem::forget(runtime);
            }
        }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The process's resource: the SDK's detectors (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`), with [`default_service_name`] where neither names a service.
fn resource() -> opentelemetry_sdk::Resource {
    let detected = opentelemetry_sdk::Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::new("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        opentelemetry_sdk::Resource::builder()
            .with_service_name(default_service_name())
            .build()
    }
}

/// An exporter whose failures are said (at most once per 10 s: a collector that is
/// down must not flood the log), since the SDK's own logging is off: a refused header, a
/// wrong path or an unreachable collector would otherwise export nothing without a word.
#[derive(Debug)]
struct Said<E> {
    inner: E,
    protocol: String,
}

impl<E> Said<E> {
    fn new(inner: E, protocol: &str) -> Self {
        Self {
            inner,
            protocol: protocol.to_owned(),
        }
    }
}

impl<E: opentelemetry_sdk::trace::SpanExporter> opentelemetry_sdk::trace::SpanExporter for Said<E> {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            crate::repeats::warn_repeated!(protocol = %self.protocol, spans, error = %e, "OTLP export failed; these spans are lost");
        }
        result
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// `OTEL_SERVICE_NAME` unset: the program's file name (the user's worker binary), as the
/// resource semantic conventions suggest for an unknown service (`unknown_service:<name>`).
fn default_service_name() -> String {
    let exe = std::env::current_exe().ok();
    let name = exe
        .as_deref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("unknown_service:{name}")
}

/// OTLP over HTTP through the reqwest client (rustls with ring, web PKI roots) the outbox
/// relay uses, run on the exporter's own runtime: the SDK's batch thread is no tokio thread.
#[derive(Debug)]
struct HttpOnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl HttpOnRuntime {
    /// Each request bounded by `timeout` (the SDK applies none to a client it is given): a
    /// collector that accepts and never answers would hold the batch thread for good.
    fn new(runtime: tokio::runtime::Handle, timeout: std::time::Duration) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(std::time::Duration::from_secs(5)))
            .build()
            .map_err(|e| Error::Config(format!("OTLP HTTP client: {e}")))?;
        Ok(Self { client, runtime })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for HttpOnRuntime {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> std::result::Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let response = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .send()
                .await?;
            let (status, headers) = (response.status(), response.headers().clone());
            let body = response.bytes().await?;
            let mut answer = opentelemetry_http::Response::builder()
                .status(status)
                .body(body)?;
            *answer.headers_mut() = headers;
            Ok::<_, opentelemetry_http::HttpError>(answer)
        });
        sent.await?
    }
}
