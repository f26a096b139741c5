//! The accept loop `palisade api` and `palisade ui` serve with: what `axum::serve` leaves
//! open (issue 58, M1). A client that does not send a whole request head within the header
//! timeout — trickling it, or idle between requests — is disconnected; at most
//! `max_connections` are served at once, and one past that is closed at once (counted as
//! `palisade_http_refused_total{reason="connections"}`), so idle sockets cannot use up the
//! process's file descriptors; a client that stops taking its answers is cut off after the
//! write timeout, so it cannot hold a slot either.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

/// The limits of one server.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Longest wait for a whole request head, from when the connection waits for one.
    pub(crate) header_timeout: Duration,
    /// Connections served at once.
    pub(crate) max_connections: usize,
    /// Longest a write may wait for the client to take data: one that stops reading its
    /// answers (pipelining requests it never reads the answers of) is cut off then.
    pub(crate) write_timeout: Duration,
}

/// Why a request's body was not read whole.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyRefused {
    /// Its `Content-Length`, or what it sent, is over the route's limit (413): said before a
    /// byte is read when the header declares it.
    TooLarge(usize),
    /// It did not arrive whole within the body timeout (408): a client trickling it.
    TooSlow(Duration),
    /// The connection failed while it was read.
    Broken(String),
}

impl BodyRefused {
    /// Its answer's status and its code (the API's error code, the refusal metric's reason).
    pub(crate) fn status(&self) -> (axum::http::StatusCode, &'static str) {
        use axum::http::StatusCode;
        match self {
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Self::TooSlow(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            Self::Broken(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        }
    }
}

impl std::fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge(limit) => write!(f, "the request body is larger than {limit} bytes"),
            Self::TooSlow(timeout) => {
                write!(f, "the request body did not arrive within {timeout:?}")
            }
            Self::Broken(e) => write!(f, "the request body could not be read: {e}"),
        }
    }
}

/// `request` with its body read whole, at most `limit` bytes within `timeout` — every
/// route of the API and the console reads its body whole anyway — so neither a body that
/// trickles nor one that declares more than its route takes holds a connection (and its
/// buffer) for longer than the timeout. A declared `Content-Length` over the limit is
/// refused before anything is read.
pub(crate) async fn buffered(
    request: axum::extract::Request,
    limit: usize,
    timeout: Duration,
) -> Result<axum::extract::Request, BodyRefused> {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyRefused::TooLarge(limit));
    }
    let (parts, body) = request.into_parts();
    let read = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit));
    let bytes = match tokio::time::timeout(timeout, read).await {
        Err(_) => return Err(BodyRefused::TooSlow(timeout)),
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(BodyRefused::TooLarge(limit))
        }
        Ok(Err(e)) => return Err(BodyRefused::Broken(e.to_string())),
    };
    Ok(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes; then accepts no
/// more and waits up to 10 s for the requests under way.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    surface: &'static str,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // (Out of file descriptors, say: wait, not spin.)
                    palisade::cli_support::warn_repeated!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = stream;
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::reads::note_refused(surface, "connections", "-", "-");
            drop(stream);
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let mut request = request.map(axum::body::Body::new);
                // (Who is asking: the console throttles failed logins per address.)
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                app.clone().oneshot(request)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(
                    TokioIo::new(palisade::cli_support::WriteDeadline::new(
                        stream,
                        limits.write_timeout,
                    )),
                    service,
                )
                .await;
        });
    }
    // Requests under way finish (each holds a slot), for at most 10 s.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(10), slots.acquire_many(all)).await;
    Ok(())
}
