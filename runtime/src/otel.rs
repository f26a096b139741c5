//! OpenTelemetry export (feature `otel`): the runtime's `tracing` spans continue each job's
//! trace and go out over OTLP.
//!
//! [`Export::from_env`] reads the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or an endpoint given in code, `--otlp-endpoint`),
//! `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` (`http/protobuf`, the default; `http/json`; `grpc`),
//! `_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` / `_ARG`, `OTEL_BSP_*`, and `OTEL_SDK_DISABLED` /
//! `OTEL_TRACES_EXPORTER=none` to turn it off. `palisade::cli::App` does this for every
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
use crate::trace::TraceContext;

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
    let parent = if context_of(&Span::current()).is_some() {
        None
    } else {
        let given = jobs.iter().find_map(|j| j.trace.clone());
        continue_trace(&span, given.as_ref());
        given
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

/// Exports the spans of this process over OTLP until dropped (which flushes what is left,
/// waiting at most the exporter's timeout).
pub struct Export {
    provider: SdkTracerProvider,
    /// Runs the exporter's I/O (tonic's channel, reqwest's connections).
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").finish_non_exhaustive()
    }
}

/// The value of the first of `names` that is set and not empty.
fn var(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
}

impl Export {
    /// An exporter as the standard variables say, `endpoint` (a base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) overriding theirs. `Ok(None)` when nothing asks for export
    /// (no endpoint given or set and `OTEL_TRACES_EXPORTER` not `otlp`) or it is turned off
    /// (`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`); `Error::Config` for a
    /// protocol or endpoint that cannot be used.
    pub fn from_env(endpoint: Option<&str>) -> Result<Option<Self>> {
        let disabled = var(&["OTEL_SDK_DISABLED"]).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let exporter = var(&["OTEL_TRACES_EXPORTER"]).unwrap_or_default();
        if disabled || exporter.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        if !exporter.is_empty() && !exporter.eq_ignore_ascii_case("otlp") {
            return Err(Error::Config(format!(
                "OTEL_TRACES_EXPORTER={exporter:?}: only \"otlp\" and \"none\" are supported"
            )));
        }
        let endpoint = endpoint.map(str::trim).filter(|e| !e.is_empty());
        let asked = endpoint.is_some()
            || exporter.eq_ignore_ascii_case("otlp")
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
        .unwrap_or_else(|| "http/protobuf".into());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("palisade-otlp")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("OTLP exporter runtime: {e}")))?;
        let bad = |e: opentelemetry_otlp::ExporterBuildError| {
            Error::Config(format!("OTLP exporter ({protocol}): {e}"))
        };
        let exporter = match protocol.as_str() {
            "grpc" => {
                // tonic's channel spawns its worker where it is built: on our runtime.
                let _inside = runtime.enter();
                let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(endpoint) = endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                builder.build().map_err(bad)?
            }
            "http/protobuf" | "http/json" => {
                let client = HttpOnRuntime::new(runtime.handle().clone())?;
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(if protocol == "http/json" {
                        opentelemetry_otlp::Protocol::HttpJson
                    } else {
                        opentelemetry_otlp::Protocol::HttpBinary
                    });
                if let Some(endpoint) = endpoint {
                    // As OTEL_EXPORTER_OTLP_ENDPOINT: a base URL the signal's path goes under.
                    builder = builder
                        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
                }
                builder.build().map_err(bad)?
            }
            other => {
                return Err(Error::Config(format!(
                    "OTLP protocol {other:?}: use grpc, http/protobuf or http/json"
                )))
            }
        };
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(var(&["OTEL_SERVICE_NAME"]).unwrap_or_else(default_service_name))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        Ok(Some(Export {
            provider,
            runtime: Some(runtime),
        }))
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans for this exporter.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("palisade"))
            .with_tracked_inactivity(false)
    }

    /// Sends what is left and stops (also on drop).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if let Err(e) = self.provider.shutdown() {
                eprintln!("palisade: OTLP export did not finish: {e}");
            }
            // Not `drop`: that would block, and may run inside another runtime.
            runtime.shutdown_background();
        }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        self.stop();
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
    fn new(runtime: tokio::runtime::Handle) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
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
