//! A real OTLP receiver: it decodes what exporters send (`POST /v1/traces`, protobuf or JSON,
//! or OTLP/gRPC's `TraceService`) with the official OpenTelemetry protobuf types
//! (`opentelemetry-proto`) and keeps every span for a test to look at.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use prost::Message as _;

/// One span as received.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// The `service.name` of the resource that sent it.
    pub service: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or empty for a root span.
    pub parent_span_id: String,
    /// Its name.
    pub name: String,
    /// The OTLP span kind (1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    /// Its attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// Its events: name and attributes.
    pub events: Vec<(String, BTreeMap<String, String>)>,
    /// Its status code (0 unset, 1 ok, 2 error).
    pub status: i32,
}

impl ReceivedSpan {
    /// An attribute's value as text ("" when absent).
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    requests: u64,
    /// The first trace export gets no answer, ever (a collector that accepted and hung).
    hang_first: bool,
}

/// The receiver: serves on 127.0.0.1 until dropped.
pub struct OtlpReceiver {
    port: u16,
    received: Arc<Mutex<Received>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OtlpReceiver {
    /// Starts it on a free port.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts one that never answers the first trace export it gets (it keeps nothing of it)
    /// and answers the later ones.
    pub fn start_hanging_first() -> Self {
        Self::start_with(true)
    }

    fn start_with(hang_first: bool) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let received = Arc::new(Mutex::new(Received {
            hang_first,
            ..Received::default()
        }));
        // Bound here, made a tokio listener on its runtime: `start` may be called from inside
        // another runtime (a `#[tokio::test]`), where `block_on` is not allowed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let kept = received.clone();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let kept = kept.clone();
                        async move { Ok::<_, Infallible>(answer(request, &kept).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            port,
            received,
            runtime: Some(runtime),
        }
    }

    /// Starts one that speaks OTLP/gRPC (traces) instead, on a free port.
    pub fn start_grpc() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let received = Arc::new(Mutex::new(Received::default()));
        let port = crate::free_port();
        let service = TraceServiceServer::new(Grpc(received.clone()));
        runtime.spawn(async move {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve(addr)
                .await;
        });
        crate::wait_for(
            "the gRPC receiver to listen",
            std::time::Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Self {
            port,
            received,
            runtime: Some(runtime),
        }
    }

    /// Its base URL (`http://127.0.0.1:<port>`), as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().spans.clone()
    }

    /// How many spans arrived.
    pub fn span_count(&self) -> usize {
        self.received.lock().unwrap().spans.len()
    }

    /// The spans of trace `trace_id`.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }

    /// How many export requests arrived.
    pub fn requests(&self) -> u64 {
        self.received.lock().unwrap().requests
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Decodes one export request (protobuf, or JSON when it says so) and keeps what it holds.
async fn answer(
    request: Request<hyper::body::Incoming>,
    kept: &Mutex<Received>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let json = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let hang = path == "/v1/traces" && std::mem::take(&mut kept.lock().unwrap().hang_first);
    if hang {
        std::future::pending::<()>().await;
    }
    let mut kept = kept.lock().unwrap();
    kept.requests += 1;
    if path != "/v1/traces" {
        return status(StatusCode::NOT_FOUND);
    }
    let decoded = if json {
        serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
    } else {
        ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string())
    };
    let Ok(export) = decoded else {
        return status(StatusCode::BAD_REQUEST);
    };
    keep_spans(&mut kept, export);
    // An empty ExportTraceServiceResponse: zero bytes of protobuf.
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Keeps the spans of one export request.
fn keep_spans(kept: &mut Received, export: ExportTraceServiceRequest) {
    for resource in export.resource_spans {
        let service = service_of(resource.resource.as_ref().map(|r| &r.attributes[..]));
        for scope in resource.scope_spans {
            for s in scope.spans {
                kept.spans.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    attributes: attributes(&s.attributes),
                    events: s
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), attributes(&e.attributes)))
                        .collect(),
                    status: s.status.map_or(0, |st| st.code),
                });
            }
        }
    }
}

/// The gRPC side: OTLP's `TraceService`, generated by opentelemetry-proto for tonic.
struct Grpc(Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.0.lock().unwrap();
        kept.requests += 1;
        keep_spans(&mut kept, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn service_of(attributes: Option<&[KeyValue]>) -> String {
    attributes
        .and_then(|a| a.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.as_ref())
        .map(text)
        .unwrap_or_default()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
