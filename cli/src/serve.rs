//! The accept loop `palisade api` and `palisade ui` serve with: what `axum::serve` leaves
//! open (issue 58, M1). A client that does not send a whole request head within the header
//! timeout — trickling it, or idle between requests — is disconnected; at most
//! `max_connections` are served at once, and one past that is closed at once (counted as
//! `palisade_http_refused_total{reason="connections"}`), so idle sockets cannot use up the
//! process's file descriptors.

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
                Ok((stream, _)) => stream,
                Err(e) => {
                    // (Out of file descriptors, say: wait, not spin.)
                    palisade::cli_support::warn_repeated!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::reads::note_refused(surface, "connections", "-", "-");
            drop(stream);
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                app.clone().oneshot(request.map(axum::body::Body::new))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    // Requests under way finish (each holds a slot), for at most 10 s.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(10), slots.acquire_many(all)).await;
    Ok(())
}
