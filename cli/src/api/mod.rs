//! `api`: the HTTP API under `/api/v1` (JSON), for producers in any language and for
//! autoscalers — enqueue (unique keys, `Idempotency-Key`), job state, result and progress,
//! cancel, queue counts, pause and resume, dead letters, flows — with its OpenAPI 3.1 document
//! at `/api/v1/openapi.json`. Served by `palisade ui` beside the console, or alone by
//! `palisade api`.
//!
//! Safe by default. Every request goes through [`guard`]:
//! - its `Host` must be one the server answers to (DNS rebinding);
//! - off loopback, or behind a proxy (a `--public-host`, the console's `--basic-auth`), it
//!   must carry `Authorization: Bearer <token>` (`--api-token`); Basic
//!   credentials are refused on `/api` and cookies are never read, so nothing a browser sends
//!   on its own authorizes a request;
//! - a request from a browser page of another origin (`Origin`, `Sec-Fetch-Site`) is refused,
//!   and every request that changes anything must say `Content-Type: application/json`, which
//!   a cross-site form cannot send and a cross-site script can send only after a CORS
//!   preflight this server never grants;
//! - a route served without its OpenAPI entry answers 500 (`routes!` registers both in one
//!   step, so that takes a deliberate `.route`).

mod endpoints;
mod integral;
mod model;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use subtle::ConstantTimeEq as _;

use super::{redacted, RedisArgs};
use model::ApiError;
use palisade::store::Stores;
use palisade::Registry;
use palisade::DEFAULT_MAX_PAYLOAD_BYTES;

/// The largest request body read: a flow at its limit ([`palisade::MAX_FLOW_BYTES`]), or one
/// job at the payload limit if that is larger, with room for its JSON.
pub(crate) fn body_limit(max_payload_bytes: usize) -> usize {
    palisade::MAX_FLOW_BYTES
        .max(max_payload_bytes)
        .saturating_add(1024 * 1024)
}

/// The most bytes a body of a route that takes no job may hold: `{}`, a filter, a reason.
const SMALL_BODY: usize = 64 * 1024;

/// The most bytes `path`'s body may hold: a batch or a flow the whole
/// [`body_limit`], one job its payload limit and 64 KiB for its fields, any other route
/// [`SMALL_BODY`]. Refused past that with 413, a declared length before a byte is read.
fn route_limit(path: Option<&str>, max_payload_bytes: usize) -> usize {
    match path {
        Some("/api/v1/jobs/batch" | "/api/v1/flows") => body_limit(max_payload_bytes),
        Some("/api/v1/jobs") => max_payload_bytes.saturating_add(SMALL_BODY),
        Some("/api/v1/waitpoints/{id}") => {
            palisade::store::waitpoint::MAX_WAITPOINT_VALUE.saturating_add(SMALL_BODY)
        }
        _ => SMALL_BODY,
    }
}

/// The shortest bearer token accepted: a guessable token is no lock.
const MIN_TOKEN_BYTES: usize = 16;

/// The routes that answer an unknown path under `/api/v1` with a JSON 404.
const UNKNOWN: [&str; 3] = ["/api/v1", "/api/v1/", "/api/v1/{*rest}"];

/// The API's own flags, shared by `palisade api` and `palisade ui`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct ApiFlags {
    /// Bearer token every API request must carry (`Authorization: Bearer <token>`), at least
    /// 16 characters. Required to serve the API beyond loopback or behind a proxy (with
    /// --public-host, or the console's --basic-auth); on plain loopback, required when set.
    #[arg(
        long,
        env = "PALISADE_API_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    api_token: Option<String>,
    /// Largest job payload the API accepts, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_PAYLOAD_BYTES)]
    pub(super) max_payload_bytes: usize,
    /// Serve /metrics (Prometheus: refused requests, the store's round trips), /healthz and
    /// /readyz on this address, e.g. 127.0.0.1:9465.
    #[arg(long, value_name = "ADDR")]
    pub(super) metrics: Option<SocketAddr>,
    /// Longest wait for a whole request head (a client trickling it, or idle between
    /// requests, is disconnected then).
    #[arg(long, default_value = "10s", value_parser = super::duration_within(Duration::from_millis(100), Duration::from_secs(3600)))]
    pub(super) header_timeout: Duration,
    /// Connections served at once; one more is closed at once (counted as refused). Keep it
    /// below the process's file descriptor limit.
    #[arg(long, default_value_t = 512, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub(super) max_connections: usize,
    /// Longest wait for a whole request body once its head arrived (a client trickling it is
    /// answered 408 and disconnected), and for a client to take an answer's data (one that
    /// stops reading is disconnected).
    #[arg(long, default_value = "30s", value_parser = super::duration_within(Duration::from_millis(100), Duration::from_secs(3600)))]
    pub(super) body_timeout: Duration,
}

impl ApiFlags {
    /// The server's limits, as the flags set them.
    pub(super) fn limits(&self) -> crate::serve::Limits {
        crate::serve::Limits {
            header_timeout: self.header_timeout,
            max_connections: self.max_connections,
            write_timeout: self.body_timeout,
        }
    }

    /// Serves /metrics when `--metrics` asks (before any runtime starts: the exporter runs
    /// its own).
    pub(super) fn serve_metrics(&self) -> anyhow::Result<()> {
        if let Some(addr) = self.metrics {
            let health = palisade::metrics::Health::new();
            health.set_ready(true);
            palisade::metrics::serve(addr, health)
                .with_context(|| format!("serving /metrics on {addr}"))?;
            tracing::info!(metrics = %addr, "serving /metrics");
        }
        Ok(())
    }
}

/// `api` flags.
#[derive(Clone, Debug, clap::Args)]
// --redis is checked by `run`, so that `--openapi` needs none.
#[command(mut_arg("redis", |a| a.required(false)))]
pub(super) struct ApiArgs {
    // (Optional only so that `--openapi` needs no Redis: clap still requires --redis
    // otherwise.)
    #[command(flatten)]
    redis: Option<RedisArgs>,
    #[command(flatten)]
    flags: ApiFlags,
    /// Address to serve the API on. Anything but a loopback address requires --api-token.
    #[arg(long, default_value = "127.0.0.1:8081", value_name = "ADDR")]
    listen: SocketAddr,
    /// A host name (with port, as clients send it: `jobs.example:8081`) the API may be reached
    /// by besides the listen address and localhost; repeatable. Requests naming any other
    /// host are refused (DNS rebinding).
    #[arg(long = "public-host", value_name = "HOST:PORT")]
    public_hosts: Vec<String>,
    /// Print the OpenAPI 3.1 document and exit, without connecting to anything (generate a
    /// client from it).
    #[arg(long)]
    openapi: bool,
}

/// The OpenAPI document, as served at `/api/v1/openapi.json`, indented.
pub(crate) fn document() -> String {
    endpoints::split()
        .1
        .to_pretty_json()
        .expect("the document is JSON")
}

/// The server's state.
pub(crate) struct Api {
    store: Stores,
    registry: Registry,
    max_payload_bytes: usize,
    /// `Bearer <token>`, when requests must carry it.
    authorization: Option<String>,
    /// Why the API is off (served beyond loopback without a token), if it is.
    off: Option<String>,
    /// Host header values accepted (lower case), and the origins they make.
    hosts: Vec<String>,
    origins: Vec<String>,
    /// The OpenAPI document, and each of its (method, path) operations.
    openapi: String,
    documented: HashSet<(Method, String)>,
    /// `--body-timeout`.
    body_timeout: Duration,
}

impl ApiFlags {
    /// The API's settings for a server on `listen`: `None` when it must stay off, with the
    /// reason (beyond loopback without a token).
    /// `exposed`: the server is meant to be reached from elsewhere (it names public hosts or
    /// asks for the console's Basic credentials), so a loopback listen address is no lock —
    /// a proxy in front of it forwards anyone.
    pub(super) fn checked(
        &self,
        listen: SocketAddr,
        exposed: bool,
    ) -> anyhow::Result<(Option<String>, Option<String>)> {
        let authorization = match self.api_token.as_deref().filter(|t| !t.is_empty()) {
            Some(token)
                if token.len() < MIN_TOKEN_BYTES
                    || !token.chars().all(|c| c.is_ascii_graphic()) =>
            {
                bail!(
                    "--api-token wants at least {MIN_TOKEN_BYTES} characters, printable ASCII \
                     without spaces or control characters"
                )
            }
            Some(token) => Some(format!("Bearer {token}")),
            None => None,
        };
        let off = (authorization.is_none() && (exposed || !listen.ip().is_loopback())).then(|| {
            format!(
                "the API is off: serving it beyond loopback ({listen}, or behind --public-host \
                 or --basic-auth) needs --api-token (PALISADE_API_TOKEN)"
            )
        });
        Ok((authorization, off))
    }
}

/// The API's routes over `store`, with their guard; `hosts` are the Host values served.
pub(super) fn router(
    store: Stores,
    registry: Registry,
    flags: &ApiFlags,
    listen: SocketAddr,
    hosts: Vec<String>,
    exposed: bool,
) -> anyhow::Result<Router> {
    let (authorization, off) = flags.checked(listen, exposed)?;
    let (routes, mut doc) = endpoints::split();
    let documented = operations(&doc);
    if authorization.is_none() {
        // Served without a token (on plain loopback): the document it serves says so, rather
        // than ask clients for a credential the server does not read.
        doc.security = None;
    }
    let origins = hosts
        .iter()
        .flat_map(|h| [format!("http://{h}"), format!("https://{h}")])
        .collect();
    let api = Arc::new(Api {
        store,
        registry,
        max_payload_bytes: flags.max_payload_bytes,
        authorization,
        off,
        hosts,
        origins,
        openapi: doc.to_json().context("writing the OpenAPI document")?,
        documented,
        body_timeout: flags.body_timeout,
    });
    let routes = UNKNOWN
        .iter()
        .fold(routes, |r, path| r.route(path, any(unknown)));
    Ok(routes
        .layer(axum::extract::DefaultBodyLimit::max(body_limit(
            flags.max_payload_bytes,
        )))
        .layer(axum::middleware::from_fn_with_state(api.clone(), guard))
        .with_state(api))
}

/// Every (method, path) operation of `doc`.
fn operations(doc: &utoipa::openapi::OpenApi) -> HashSet<(Method, String)> {
    let mut out = HashSet::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in [
            (Method::GET, &item.get),
            (Method::POST, &item.post),
            (Method::PUT, &item.put),
            (Method::DELETE, &item.delete),
            (Method::PATCH, &item.patch),
        ] {
            if op.is_some() {
                out.insert((method, path.clone()));
            }
        }
    }
    out
}

/// An unknown path under `/api/v1`.
async fn unknown() -> ApiError {
    ApiError::not_found("no such endpoint (the document is at /api/v1/openapi.json)")
}

/// The checks every API request passes (see the module's documentation), then the
/// response's headers: never cached, never sniffed.
async fn guard(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let admitted = admitted(&api, &request);
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let limit = route_limit(path.as_deref(), api.max_payload_bytes);
    let (method, uri) = (request.method().clone(), request.uri().path().to_owned());
    let read = match admitted {
        Ok(()) => crate::serve::buffered(request, limit, api.body_timeout)
            .await
            .map_err(|refused| {
                let (status, code) = refused.status();
                ApiError::new(status, code, refused.to_string())
            }),
        Err(e) => Err(e),
    };
    let mut response = match read {
        Ok(request) => answered(next.run(request).await).await,
        Err(e) => {
            crate::reads::note_refused("api", e.code(), method.as_str(), &uri);
            let unread = matches!(
                e.status(),
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
            );
            let mut response = e.into_response();
            if unread {
                // (The rest of its body is not read: the connection ends with this answer.)
                response
                    .headers_mut()
                    .insert(header::CONNECTION, "close".parse().expect("static"));
            }
            response
        }
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        "nosniff".parse().expect("static"),
    );
    response
}

/// `response`, with axum's own failures (empty or text: a 405, a path segment that is not
/// UTF-8, an unknown path) said in JSON like every other.
async fn answered(mut response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if (status.is_client_error() || status.is_server_error()) && !is_json {
        let allow = response.headers().get(header::ALLOW).cloned();
        let text = axum::body::to_bytes(std::mem::take(response.body_mut()), 64 * 1024)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&text).trim().to_owned();
        let message = if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            text
        };
        let code = match status {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            s if s.is_server_error() => "backend",
            _ => "invalid_request",
        };
        response = ApiError::new(status, code, message).into_response();
        if let Some(allow) = allow {
            response.headers_mut().insert(header::ALLOW, allow);
        }
    }
    response
}

fn not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not take that method",
    )
}

/// Whether `request` may reach its endpoint.
fn admitted(api: &Api, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let forbidden = |m: &str| ApiError::new(StatusCode::FORBIDDEN, "forbidden", m);
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    if !host.is_some_and(|h| api.hosts.contains(&h)) {
        return Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "unknown_host",
            "unknown host; add it with --public-host",
        ));
    }
    // A browser page of another site: refused whatever else it carries.
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ours = origin
            .to_str()
            .is_ok_and(|o| api.origins.iter().any(|ok| ok.eq_ignore_ascii_case(o)));
        if !ours {
            return Err(forbidden("cross-origin requests are refused"));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.to_str(), Ok("same-origin" | "none")) {
            return Err(forbidden("cross-site requests are refused"));
        }
    }
    let matched = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let is_document = matched.as_deref() == Some("/api/v1/openapi.json");
    if let Some(why) = &api.off {
        return Err(forbidden(why));
    }
    if is_document {
        // It holds no data: generators and people read it without a token.
        return Ok(());
    }
    let given = headers.get(header::AUTHORIZATION).map(|h| h.as_bytes());
    if given.is_some_and(|g| g.len() >= 6 && g[..6].eq_ignore_ascii_case(b"basic ")) {
        // A browser resends Basic credentials on its own: they never authorize an API call.
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the API takes a bearer token (Authorization: Bearer <token>), not Basic credentials",
        ));
    }
    if let Some(expected) = &api.authorization {
        // The scheme is case-insensitive (RFC 9110); the token is compared in constant time.
        let ok = given.is_some_and(|g| {
            g.len() > 7
                && g[..7].eq_ignore_ascii_case(b"bearer ")
                && bool::from(g[7..].ct_eq(&expected.as_bytes()[7..]))
        });
        if !ok {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token (Authorization: Bearer <token>)",
            ));
        }
    }
    match &matched {
        Some(path) if !UNKNOWN.contains(&path.as_str()) => {
            let method = match *request.method() {
                Method::HEAD => Method::GET,
                ref m => m.clone(),
            };
            if !api.documented.contains(&(method, path.clone())) {
                let mut allowed: Vec<&str> = api
                    .documented
                    .iter()
                    .filter(|(_, p)| p == path)
                    .map(|(m, _)| m.as_str())
                    .collect();
                if !allowed.is_empty() {
                    allowed.sort_unstable();
                    return Err(not_allowed().allowing(allowed.join(", ")));
                }
                tracing::error!(path, "api: a route is served without its OpenAPI entry");
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "undocumented",
                    format!("{path} is served without its OpenAPI entry (a bug)"),
                ));
            }
        }
        _ => {}
    }
    // (After the method: an endpoint that does not take it answers 405, and no endpoint 404,
    // whatever the body.)
    let known = matched.is_some_and(|p| !UNKNOWN.contains(&p.as_str()));
    if known && !matches!(*request.method(), Method::GET | Method::HEAD) {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send Content-Type: application/json (an empty body is {})",
            ));
        }
    }
    Ok(())
}

/// Serves the API alone until SIGINT / SIGTERM.
pub(super) fn run(args: ApiArgs, registry: Registry) -> anyhow::Result<()> {
    if args.openapi {
        println!("{}", document());
        return Ok(());
    }
    let exposed = !args.public_hosts.is_empty();
    // A bad token is refused before anything connects.
    args.flags.checked(args.listen, exposed)?;
    if (exposed || !args.listen.ip().is_loopback())
        && args.flags.api_token.as_deref().is_none_or(str::is_empty)
    {
        bail!(
            "--listen {}: serving the API beyond this host (or behind --public-host) needs \
             --api-token (it can enqueue, cancel and retry jobs)",
            args.listen
        );
    }
    let Some(redis) = &args.redis else {
        bail!("--redis is required");
    };
    args.flags.serve_metrics()?;
    super::runtime()?.block_on(async {
        let (_, store) = redis
            .store_with(args.flags.max_payload_bytes, |s| s)
            .await?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {} (choose another with --listen)", args.listen))?;
        let bound = listener.local_addr()?;
        let hosts = crate::reads::allowed_hosts(bound, &args.public_hosts);
        let app = router(store, registry, &args.flags, bound, hosts, exposed)?
            .route("/healthz", get(|| async { "ok\n" }));
        println!(
            "palisade api: http://{bound}/api/v1/ over {} prefix {}",
            redacted(&redis.redis),
            redis.prefix
        );
        tracing::info!(listen = %bound, "api serving");
        let limits = args.flags.limits();
        crate::serve::serve(listener, app, limits, "api", super::shutdown_signal())
            .await
            .context("serving the API")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt as _;

    const LISTEN: &str = "127.0.0.1:8081";

    fn app(token: Option<&str>, listen: &str) -> Router {
        let listen: SocketAddr = listen.parse().unwrap();
        let flags = ApiFlags {
            api_token: token.map(str::to_owned),
            max_payload_bytes: 1024,
            metrics: None,
            header_timeout: Duration::from_secs(10),
            max_connections: 512,
            body_timeout: Duration::from_secs(30),
        };
        let store = Stores::from(Arc::new(palisade::MemoryLeaseStore::new()));
        let registry =
            Registry::new().register("mail", |_ctx, _p: serde_json::Value| async { Ok(()) });
        let hosts = crate::reads::allowed_hosts(listen, &[]);
        router(store, registry, &flags, listen, hosts, false).unwrap()
    }

    async fn send(app: &Router, request: axum::http::Request<Body>) -> (StatusCode, String) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// A GET of `path` to the server on its own Host.
    fn fetch(path: &str) -> axum::http::Request<Body> {
        axum::http::Request::get(path)
            .header(header::HOST, LISTEN)
            .body(Body::empty())
            .unwrap()
    }

    fn post(path: &str) -> axum::http::request::Builder {
        axum::http::Request::post(path).header(header::HOST, LISTEN)
    }

    const JOB: &str = r#"{"kind":"mail","payload":{"to":"a@x"}}"#;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// What a web page can make a browser send is refused: a form (text/plain, urlencoded), a
    /// foreign Origin, a cross-site fetch, Basic credentials; the right request passes.
    #[test]
    fn forged_cross_site_requests_are_refused() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let json = "application/json";
            for (request, status, code) in [
                (
                    post("/api/v1/jobs").header(header::CONTENT_TYPE, "text/plain"),
                    415,
                    "unsupported_media_type",
                ),
                (
                    post("/api/v1/jobs")
                        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded"),
                    415,
                    "unsupported_media_type",
                ),
                (post("/api/v1/jobs"), 415, "unsupported_media_type"),
                (
                    post("/api/v1/jobs")
                        .header(header::CONTENT_TYPE, json)
                        .header(header::ORIGIN, "https://evil.example"),
                    403,
                    "forbidden",
                ),
                (
                    post("/api/v1/jobs")
                        .header(header::CONTENT_TYPE, json)
                        .header(header::ORIGIN, "null"),
                    403,
                    "forbidden",
                ),
                (
                    post("/api/v1/jobs")
                        .header(header::CONTENT_TYPE, json)
                        .header("sec-fetch-site", "cross-site"),
                    403,
                    "forbidden",
                ),
                (
                    post("/api/v1/jobs")
                        .header(header::CONTENT_TYPE, json)
                        .header(header::AUTHORIZATION, "Basic dTpw"),
                    401,
                    "unauthorized",
                ),
                (
                    axum::http::Request::post("/api/v1/jobs")
                        .header(header::HOST, "evil.example:8081")
                        .header(header::CONTENT_TYPE, json),
                    421,
                    "unknown_host",
                ),
            ] {
                let (got, body) = send(&app, request.body(Body::from(JOB)).unwrap()).await;
                assert_eq!(got.as_u16(), status, "{body}");
                assert!(body.contains(&format!("\"code\":\"{code}\"")), "{body}");
            }
            // The page's own origin, and no origin at all (curl, Python), pass.
            for origin in [Some("http://127.0.0.1:8081"), None] {
                let mut request = post("/api/v1/jobs")
                    .header(header::CONTENT_TYPE, "application/json; charset=utf-8");
                if let Some(origin) = origin {
                    request = request.header(header::ORIGIN, origin);
                }
                let (got, body) = send(&app, request.body(Body::from(JOB)).unwrap()).await;
                assert_eq!(got, StatusCode::CREATED, "{body}");
            }
        });
    }

    /// A debounced enqueue folds into the job waiting under its key (answered `debounced`,
    /// that job's id); a debounce with a delay, or with a quiet period of zero, is refused.
    #[test]
    fn a_debounced_enqueue_answers_the_pending_job() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let enqueue = |body: &'static str| {
                post("/api/v1/jobs")
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body))
                    .unwrap()
            };
            let debounced = r#"{"kind":"mail","payload":{"to":"a@x"},"timeout_ms":500,
                "deadline_ms":4000000000000,"max_snoozes":3,
                "debounce":{"key":"to:a","quiet_ms":60000,"max_wait_ms":600000}}"#;
            let (got, first) = send(&app, enqueue(debounced)).await;
            assert_eq!(got, StatusCode::CREATED, "{first}");
            let first: serde_json::Value = serde_json::from_str(&first).unwrap();
            assert_eq!(first["debounced"], false);
            let (got, again) = send(&app, enqueue(debounced)).await;
            assert_eq!(got, StatusCode::OK, "{again}");
            let again: serde_json::Value = serde_json::from_str(&again).unwrap();
            assert_eq!(
                (&again["id"], &again["created"], &again["debounced"]),
                (&first["id"], &serde_json::json!(false), &serde_json::json!(true))
            );
            for bad in [
                r#"{"kind":"mail","payload":{},"delay_ms":5,"debounce":{"key":"k","quiet_ms":1,"max_wait_ms":1}}"#,
                r#"{"kind":"mail","payload":{},"debounce":{"key":"k","quiet_ms":0,"max_wait_ms":1}}"#,
                r#"{"kind":"mail","payload":{},"timeout_ms":0}"#,
            ] {
                let (got, body) = send(&app, enqueue(bad)).await;
                assert_eq!(got, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
            }
        });
    }

    #[test]
    fn a_token_is_required_when_set_and_off_loopback() {
        rt().block_on(async {
            let token = "0123456789abcdef-secret";
            let served = app(Some(token), LISTEN);
            let get = |auth: Option<&str>| {
                let mut r = axum::http::Request::get("/api/v1/queues").header(header::HOST, LISTEN);
                if let Some(auth) = auth {
                    r = r.header(header::AUTHORIZATION, auth);
                }
                r.body(Body::empty()).unwrap()
            };
            assert_eq!(send(&served, get(None)).await.0, StatusCode::UNAUTHORIZED);
            assert_eq!(
                send(&served, get(Some("Bearer wrong-token-0123456")))
                    .await
                    .0,
                StatusCode::UNAUTHORIZED
            );
            assert_eq!(
                send(&served, get(Some(&format!("Bearer {token}")))).await.0,
                StatusCode::OK
            );
            // The document is public (it holds no data), and asks for the token; one served
            // without a token does not (found by Schemathesis: it asked for a credential the
            // server did not read).
            let (status, doc) = send(&served, fetch("/api/v1/openapi.json")).await;
            assert_eq!(status, StatusCode::OK);
            assert!(doc.contains(r#""security":[{"bearer":[]}]"#), "{doc}");
            let (_, open_doc) = send(&app(None, LISTEN), fetch("/api/v1/openapi.json")).await;
            assert!(!open_doc.contains(r#""security":[{"bearer":[]}]"#));
            // Beyond loopback without a token the API is off, whatever is sent.
            let open = app(None, "0.0.0.0:8081");
            let r = axum::http::Request::get("/api/v1/queues")
                .header(header::HOST, "127.0.0.1:8081")
                .body(Body::empty())
                .unwrap();
            let (status, body) = send(&open, r).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
            assert!(body.contains("--api-token"), "{body}");
            // A short token is refused at start, and so is one with a control character or a
            // space (issue 58: a pasting mistake, or a value no header can carry).
            for bad in [
                "short",
                "long-enough-token-\u{7}-bell",
                "long enough token with spaces",
            ] {
                let flags = ApiFlags {
                    api_token: Some(bad.into()),
                    max_payload_bytes: 1,
                    metrics: None,
                    header_timeout: Duration::from_secs(10),
                    max_connections: 512,
                    body_timeout: Duration::from_secs(30),
                };
                assert!(
                    flags.checked(LISTEN.parse().unwrap(), false).is_err(),
                    "{bad:?}"
                );
            }
            // On loopback behind a proxy (public hosts, or the console's Basic auth), no token
            // means no API either: the proxy forwards anyone.
            let flags = ApiFlags {
                api_token: None,
                max_payload_bytes: 1,
                metrics: None,
                header_timeout: Duration::from_secs(10),
                max_connections: 512,
                body_timeout: Duration::from_secs(30),
            };
            let (_, off) = flags.checked(LISTEN.parse().unwrap(), true).unwrap();
            assert!(off.is_some());
            let (_, off) = flags.checked(LISTEN.parse().unwrap(), false).unwrap();
            assert!(off.is_none());
            // The scheme in any case; a 401 says which scheme it wants.
            let lower = format!("bearer {token}");
            assert_eq!(send(&served, get(Some(&lower))).await.0, StatusCode::OK);
            let response = served.clone().oneshot(get(None)).await.unwrap();
            assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        });
    }

    /// Every documented operation is served (none answers the router's 404 or 405), and a
    /// route served without its entry answers 500: an endpoint added without its entry fails
    /// the first test that calls it.
    #[test]
    fn the_document_and_the_routes_agree() {
        rt().block_on(async {
            let (routes, doc) = endpoints::split();
            let ops = operations(&doc);
            assert!(ops.len() >= 15, "{ops:?}");
            let app = app(None, LISTEN);
            for (method, path) in &ops {
                let concrete = path
                    .replace("{id}", "00000000-0000-4000-8000-000000000000")
                    .replace("{queue}", "default");
                let request = axum::http::Request::builder()
                    .method(method.clone())
                    .uri(&concrete)
                    .header(header::HOST, LISTEN)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from("{}"))
                    .unwrap();
                let (status, body) = send(&app, request).await;
                assert_ne!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}: {body}"
                );
                assert!(
                    !body.contains("no such endpoint"),
                    "{method} {path}: {body}"
                );
                assert!(
                    body.starts_with('{'),
                    "{method} {path} answers JSON: {body}"
                );
            }
            drop(routes);
            // A route registered without `routes!`.
            let (_, doc) = endpoints::split();
            let listen: SocketAddr = LISTEN.parse().unwrap();
            let api = Arc::new(Api {
                store: Stores::from(Arc::new(palisade::MemoryLeaseStore::new())),
                registry: Registry::new(),
                max_payload_bytes: 1,
                authorization: None,
                off: None,
                hosts: crate::reads::allowed_hosts(listen, &[]),
                origins: Vec::new(),
                openapi: String::new(),
                documented: operations(&doc),
                body_timeout: Duration::from_secs(30),
            });
            let sneaky = Router::new()
                .route("/api/v1/sneaky", get(|| async { "hi" }))
                .layer(axum::middleware::from_fn_with_state(api.clone(), guard))
                .with_state(api);
            let r = fetch("/api/v1/sneaky");
            let (status, body) = send(&sneaky, r).await;
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
            assert!(body.contains("undocumented"), "{body}");
            // The document says 3.1.
            let json: serde_json::Value = serde_json::from_str(&doc.to_json().unwrap()).unwrap();
            assert!(
                json["openapi"].as_str().unwrap().starts_with("3.1"),
                "{json}"
            );
        });
    }

    /// The copy in the repository (docs/openapi.json, for readers and client generators) is
    /// the document the code makes: an endpoint added or changed without it fails here.
    #[test]
    fn the_committed_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed.trim_end() == document().trim_end(),
            "docs/openapi.json is stale: run `cargo run -p palisade-jobs --bin palisade -- api \
             --openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn unknown_paths_wrong_methods_and_big_bodies_answer_json() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let r = fetch("/api/v1/nope");
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            assert!(body.contains("\"code\":\"not_found\""), "{body}");
            for path in [
                "/api/v1",
                "/api/v1/",
                "/api/v1/jobs/%FF",
                "/api/v1/queues/%C0/dead",
            ] {
                let r = fetch(path);
                let (status, body) = send(&app, r).await;
                assert!(status.is_client_error(), "{path}: {status}");
                assert!(body.starts_with("{\"error\""), "{path}: {body}");
            }
            let r = fetch("/api/v1/jobs");
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
            assert!(body.contains("method_not_allowed"), "{body}");
            // A method an endpoint does not take is 405 before the body's type is looked at,
            // and an unknown endpoint 404 (Schemathesis' ST204: they were 415).
            for (method, path, want) in [
                ("TRACE", "/api/v1/queues", StatusCode::METHOD_NOT_ALLOWED),
                ("DELETE", "/api/v1/jobs/x", StatusCode::METHOD_NOT_ALLOWED),
                (
                    "PUT",
                    "/api/v1/queues/q/pause",
                    StatusCode::METHOD_NOT_ALLOWED,
                ),
                ("POST", "/api/v1/nope", StatusCode::NOT_FOUND),
            ] {
                let r = axum::http::Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::HOST, LISTEN)
                    .body(Body::empty())
                    .unwrap();
                let (status, body) = send(&app, r).await;
                assert_eq!(status, want, "{method} {path}: {body}");
            }
            let big = format!(
                r#"{{"kind":"mail","payload":"{}"}}"#,
                "x".repeat(body_limit(1024))
            );
            let r = post("/api/v1/jobs")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(big))
                .unwrap();
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
            assert!(body.contains("too_large"), "{body}");
            // Over the payload limit (1,024 here) but under the body limit: the library's rule.
            let r = post("/api/v1/jobs")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(format!(
                    r#"{{"kind":"mail","payload":"{}"}}"#,
                    "x".repeat(2000)
                )))
                .unwrap();
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            assert!(body.contains("the limit is 1024"), "{body}");
        });
    }

    /// Every operation documents its refusals and failures, so a generated client knows the
    /// error body.
    #[test]
    fn every_operation_documents_its_errors() {
        let (_, doc) = endpoints::split();
        let json: serde_json::Value = serde_json::from_str(&doc.to_json().unwrap()).unwrap();
        for (path, item) in json["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                assert!(responses.contains_key("4XX"), "{method} {path}");
                if path != "/api/v1/openapi.json" {
                    assert!(responses.contains_key("5XX"), "{method} {path}");
                }
            }
        }
    }

    /// Wrong methods answer 405 in JSON with `Allow`, whoever refuses them; actions refuse a
    /// field they do not take; the document is public even to Basic credentials; a refusal
    /// is not cached either; a huge dead-letter retry limit moves what the queue held.
    #[test]
    fn methods_actions_and_limits() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let json = "application/json";
            for (method, path, allow) in [
                (Method::GET, "/api/v1/jobs", "POST"),
                (Method::POST, "/api/v1/openapi.json", "GET"),
                (Method::DELETE, "/api/v1/queues/default", "GET"),
            ] {
                let r = axum::http::Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .header(header::HOST, LISTEN)
                    .header(header::CONTENT_TYPE, json)
                    .body(Body::empty())
                    .unwrap();
                let response = app.clone().oneshot(r).await.unwrap();
                assert_eq!(
                    response.status(),
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}"
                );
                let got = response
                    .headers()
                    .get(header::ALLOW)
                    .map(|a| a.to_str().unwrap().to_owned());
                assert!(
                    got.as_deref().is_some_and(|a| a.contains(allow)),
                    "{method} {path}: {got:?}"
                );
            }
            let r = post("/api/v1/queues/default/pause")
                .header(header::CONTENT_TYPE, json)
                .body(Body::from(r#"{"reason":"x"}"#))
                .unwrap();
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            let r = axum::http::Request::get("/api/v1/openapi.json")
                .header(header::HOST, LISTEN)
                .header(header::AUTHORIZATION, "Basic dTpw")
                .body(Body::empty())
                .unwrap();
            assert_eq!(send(&app, r).await.0, StatusCode::OK);
            let r = post("/api/v1/jobs").body(Body::from(JOB)).unwrap();
            let response = app.clone().oneshot(r).await.unwrap();
            assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
            // Three dead letters, a limit of a billion: three move, and the call ends.
            for _ in 0..3 {
                let r = post("/api/v1/jobs")
                    .header(header::CONTENT_TYPE, json)
                    .body(Body::from(JOB))
                    .unwrap();
                let (_, body) = send(&app, r).await;
                let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let r = post(&format!("/api/v1/jobs/{id}/cancel"))
                    .header(header::CONTENT_TYPE, json)
                    .body(Body::empty())
                    .unwrap();
                assert_eq!(send(&app, r).await.0, StatusCode::OK);
            }
            let r = post("/api/v1/queues/default/dead/retry")
                .header(header::CONTENT_TYPE, json)
                .body(Body::from(r#"{"limit":1000000000}"#))
                .unwrap();
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body, r#"{"retried":3,"read":3,"kept":0}"#);
            // Filters: none of kind "other"; a purge of what is left takes nothing.
            let r = post("/api/v1/queues/default/dead/purge")
                .header(header::CONTENT_TYPE, json)
                .body(Body::from(
                    r#"{"kind":"other","reason":"x","older_than_ms":1}"#,
                ))
                .unwrap();
            let (status, body) = send(&app, r).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, r#"{"purged":0,"read":0}"#)
            );
            let r = post("/api/v1/queues/default/dead/purge")
                .header(header::CONTENT_TYPE, json)
                .body(Body::from(r#"{"older_than_ms":999999999999999}"#))
                .unwrap();
            assert_eq!(send(&app, r).await.0, StatusCode::UNPROCESSABLE_ENTITY);
            // The body limit follows a payload limit above the flow limit.
            assert!(body_limit(64 << 20) > 64 << 20);
            assert!(body_limit(1) > palisade::MAX_FLOW_BYTES);
        });
    }

    /// A cancelled job reads as dead with its reason, found in its queue's dead letters; a
    /// `queue` hint that names another queue does not find it; cancelling it again is a 404.
    #[test]
    fn a_cancelled_job_reads_dead() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let r = post("/api/v1/jobs")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(JOB))
                .unwrap();
            let (_, body) = send(&app, r).await;
            let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned();
            let cancel = || {
                post(&format!("/api/v1/jobs/{id}/cancel"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::empty())
                    .unwrap()
            };
            let (status, body) = send(&app, cancel()).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert!(body.contains("\"outcome\":\"removed\""), "{body}");
            let (status, _) = send(&app, cancel()).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            let get = |q: &str| {
                axum::http::Request::get(format!("/api/v1/jobs/{id}{q}"))
                    .header(header::HOST, LISTEN)
                    .body(Body::empty())
                    .unwrap()
            };
            for q in ["", "?queue=default"] {
                let (status, body) = send(&app, get(q)).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                assert!(
                    body.contains("\"state\":\"dead\"")
                        && body.contains("cancelled through the HTTP API"),
                    "{body}"
                );
            }
            let (status, _) = send(&app, get("?queue=other")).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            let (status, body) = send(&app, get("?nope=1")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        });
    }

    /// The same request with the same Idempotency-Key adds one job; a batch with one bad job
    /// adds none and names it.
    #[test]
    fn idempotent_enqueue_and_all_or_nothing_batches() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let enqueue = |key: &str| {
                post("/api/v1/jobs")
                    .header(header::CONTENT_TYPE, "application/json")
                    .header("idempotency-key", key)
                    .body(Body::from(JOB))
                    .unwrap()
            };
            let (s1, b1) = send(&app, enqueue("order-7")).await;
            let (s2, b2) = send(&app, enqueue("order-7")).await;
            assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::OK), "{b1} {b2}");
            let id = |b: &str| serde_json::from_str::<serde_json::Value>(b).unwrap()["id"].clone();
            assert_eq!(id(&b1), id(&b2));
            assert!(b2.contains("\"created\":false"), "{b2}");
            let batch = r#"{"jobs":[{"kind":"mail","payload":{}},{"kind":"mail","payload":{},"queue":"bad queue\u0000"}]}"#;
            let r = post("/api/v1/jobs/batch").header(header::CONTENT_TYPE, "application/json").body(Body::from(batch)).unwrap();
            let (status, body) = send(&app, r).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            assert!(body.contains("jobs[1]"), "{body}");
            let r = fetch("/api/v1/queues/default");
            let (_, body) = send(&app, r).await;
            let counts: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(counts["counts"]["ready"], 1, "{body}");
        });
    }

    /// Issue 58 scope 5: what the document allows the server takes, and what it does not
    /// the server refuses. A body is an object (not an array read as a positional job, not
    /// `null`); `968.0` is the integer 968 (JSON Schema's reading), `968.5` is not; a page
    /// past its limit is refused, not cut short.
    #[test]
    fn bodies_are_objects_and_integers_are_read_as_json_schema_reads_them() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let request = |path: &str, body: &str| {
                post(path)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_owned()))
                    .unwrap()
            };
            for (path, body, want) in [
                (
                    "/api/v1/jobs",
                    r#"{"kind":"mail","payload":{},"priority":3.0,"max_attempts":2.0}"#,
                    StatusCode::CREATED,
                ),
                (
                    "/api/v1/jobs",
                    r#"{"kind":"mail","payload":{},"priority":3.5}"#,
                    StatusCode::BAD_REQUEST,
                ),
                ("/api/v1/jobs", r#"["mail",{}]"#, StatusCode::BAD_REQUEST),
                ("/api/v1/jobs", "null", StatusCode::BAD_REQUEST),
                ("/api/v1/queues/q/pause", "[]", StatusCode::BAD_REQUEST),
                ("/api/v1/queues/q/pause", "", StatusCode::OK),
                (
                    "/api/v1/queues/q/dead/retry",
                    r#"{"limit":5.0}"#,
                    StatusCode::OK,
                ),
            ] {
                let (status, answer) = send(&app, request(path, body)).await;
                assert_eq!(status, want, "{path} {body}: {answer}");
            }
            // A payload over the limit is refused before anything reads it (found by the attack
            // on this change: a 32 MiB payload was parsed for its fingerprint first, 0.9 GB).
            let big = format!(
                r#"{{"kind":"nope","payload":{{"x":"{}"}},"id":"6f1c0000-0000-4000-8000-00000000b16b"}}"#,
                "a".repeat(2000)
            );
            let (status, answer) = send(&app, request("/api/v1/jobs", &big)).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
            assert!(answer.contains("the limit is 1024"), "{answer}");
            for (path, want) in [
                ("/api/v1/queues/q/jobs?limit=1000", StatusCode::OK),
                ("/api/v1/queues/q/jobs?limit=1001", StatusCode::BAD_REQUEST),
                ("/api/v1/queues/q/jobs?state=later", StatusCode::BAD_REQUEST),
                ("/api/v1/queues/q/dead?limit=1001", StatusCode::BAD_REQUEST),
                (
                    "/api/v1/queues/q/dead?offset=100000001",
                    StatusCode::BAD_REQUEST,
                ),
            ] {
                let (status, answer) = send(&app, fetch(path)).await;
                assert_eq!(status, want, "{path}: {answer}");
            }
        });
    }

    /// Issue 58 (M4): an Idempotency-Key, or a job id, reused with another request is refused
    /// (422 `idempotency_key_reused`, naming the key) and adds nothing — a batch whole — where
    /// it used to answer 200 with the first job's id and drop the second request silently.
    #[test]
    fn a_key_or_id_reused_with_another_request_is_refused_whole() {
        rt().block_on(async {
            let app = app(None, LISTEN);
            let request = |path: &str, key: Option<&str>, body: &str| {
                let r = post(path).header(header::CONTENT_TYPE, "application/json");
                let r = match key {
                    Some(key) => r.header("idempotency-key", key),
                    None => r,
                };
                r.body(Body::from(body.to_owned())).unwrap()
            };
            let refused = |status: StatusCode, body: &str, named: &str| {
                assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
                assert!(
                    body.contains("idempotency_key_reused") && body.contains(named),
                    "{body}"
                );
            };
            let other = r#"{"kind":"mail","payload":{"to":"b@x"}}"#;
            let (status, _) = send(&app, request("/api/v1/jobs", Some("k1"), JOB)).await;
            assert_eq!(status, StatusCode::CREATED);
            // The same payload written otherwise is the same request.
            let spaced = r#"{"payload": { "to" : "a\u0040x" }, "kind": "mail"}"#;
            let (status, body) = send(&app, request("/api/v1/jobs", Some("k1"), spaced)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let (status, body) = send(&app, request("/api/v1/jobs", Some("k1"), other)).await;
            refused(status, &body, "k1");
            // Another queue or priority is another request too.
            let queued = r#"{"kind":"mail","payload":{"to":"a@x"},"queue":"q2"}"#;
            let (status, body) = send(&app, request("/api/v1/jobs", Some("k1"), queued)).await;
            refused(status, &body, "k1");
            // A batch: the same one again answers its jobs; one changed, one more or one
            // fewer is refused, none of it added.
            let batch = |jobs: &[&str]| format!(r#"{{"jobs":[{}]}}"#, jobs.join(","));
            let b = "/api/v1/jobs/batch";
            let (status, body) = send(&app, request(b, Some("b1"), &batch(&[JOB, JOB]))).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body.matches("\"created\":true").count(), 2, "{body}");
            let (status, body) = send(&app, request(b, Some("b1"), &batch(&[JOB, JOB]))).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body.matches("\"created\":false").count(), 2, "{body}");
            for jobs in [&[JOB, other][..], &[JOB], &[JOB, JOB, JOB]] {
                let (status, body) = send(&app, request(b, Some("b1"), &batch(jobs))).await;
                refused(status, &body, "b1");
            }
            // A producer-chosen id: the same job is the job, another one is refused.
            let id = "6f1c0000-0000-4000-8000-00000000abcd";
            let named =
                |to: &str| format!(r#"{{"kind":"mail","payload":{{"to":"{to}"}},"id":"{id}"}}"#);
            let (status, _) = send(&app, request("/api/v1/jobs", None, &named("a@x"))).await;
            assert_eq!(status, StatusCode::CREATED);
            let (status, _) = send(&app, request("/api/v1/jobs", None, &named("a@x"))).await;
            assert_eq!(status, StatusCode::OK);
            let (status, body) = send(&app, request("/api/v1/jobs", None, &named("b@x"))).await;
            refused(status, &body, id);
            // A debounced job's id answers the job it folded into, retried as it was (its
            // id is not fingerprinted: a debounce key folds other payloads by design).
            let debounced = |id: &str, to: &str| {
                format!(
                    r#"{{"kind":"mail","payload":{{"to":"{to}"}},"id":"{id}","queue":"deb","debounce":{{"key":"d1","quiet_ms":600000,"max_wait_ms":3600000}}}}"#
                )
            };
            let first = debounced("6f1c0000-0000-4000-8000-00000000d001", "a@x");
            let second = debounced("6f1c0000-0000-4000-8000-00000000d002", "b@x");
            let (status, _) = send(&app, request("/api/v1/jobs", None, &first)).await;
            assert_eq!(status, StatusCode::CREATED);
            for _ in 0..2 {
                let (status, body) = send(&app, request("/api/v1/jobs", None, &second)).await;
                assert!(
                    status == StatusCode::OK && body.contains("00000000d001"),
                    "{status} {body}"
                );
            }
            let (_, body) = send(&app, fetch("/api/v1/queues/default")).await;
            let counts: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(counts["counts"]["ready"], 4, "{body}");
            // A flow: the same one under its key again is 201; another graph is refused.
            let step = |name: &str, after: &str| {
                format!(
                    r#"{{"name":"{name}","job":{{"kind":"mail","payload":{{}}}},"after":[{after}]}}"#
                )
            };
            let flow = |steps: &[String]| format!(r#"{{"steps":[{}]}}"#, steps.join(","));
            let one = flow(&[step("a", "")]);
            for _ in 0..2 {
                let (status, body) = send(&app, request("/api/v1/flows", Some("f1"), &one)).await;
                assert_eq!(status, StatusCode::CREATED, "{body}");
            }
            let two = flow(&[step("a", ""), step("b", r#"{"step":"a"}"#)]);
            let (status, body) = send(&app, request("/api/v1/flows", Some("f1"), &two)).await;
            refused(status, &body, "is not one of its steps");
            assert!(body.contains("Idempotency-Key \\\"f1\\\""), "{body}");
        });
    }
}
