//! The connection to Redis: URL parsing (TLS, passwords redacted), the pool, one shared
//! multiplexed connection per store, and the classification of Redis errors by what the
//! caller should do.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, RetryMethod};
use deadpool_redis::{Manager, Pool, Runtime};

use crate::error::{Error, Result};

/// `url` with any password replaced by `***` — in the userinfo, or a `pass`/`password`
/// query parameter (`redis+unix://` URLs) — for logs, pages and error messages.
pub fn redacted(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((url, query)) => (url, Some(query)),
        None => (url, None),
    };
    let mut shown = redacted_userinfo(url);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if key == "pass" || key == "password" => format!("{key}=***"),
                _ => param.to_owned(),
            })
            .collect();
        shown = format!("{shown}?{}", params.join("&"));
    }
    shown
}

fn redacted_userinfo(url: &str) -> String {
    // Without a scheme (a typo), everything before the last '@' is still userinfo.
    let start = url.find("://").map_or(0, |i| i + 3);
    match url.rfind('@') {
        Some(at) if at >= start => {
            let userinfo = &url[start..at];
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".into()
            };
            format!("{}{shown}{}", &url[..start], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A connection pool for `url` (`redis://[user:password@]host[:port][/db]`, or `rediss://`
/// for TLS) whose operations fail within seconds when Redis is unreachable or stops answering,
/// instead of hanging. The URL is checked here; nothing connects until the first operation
/// (see [`ping`]).
pub fn pool(url: &str) -> Result<Pool> {
    pool_with_ca(url, None)
}

/// [`pool`], trusting the PEM certificate authority in `ca_file` for a `rediss://` URL
/// (otherwise the system's trust store is used).
pub fn pool_with_ca(url: &str, ca_file: Option<&std::path::Path>) -> Result<Pool> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::Config(format!("invalid Redis URL {}: {e}", redacted(url)))
    };
    let mut info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| bad(&e))?;
    if url.starts_with("rediss://") {
        // One process-wide rustls provider; a second install attempt is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root_cert = ca_file
            .map(|path| {
                std::fs::read(path)
                    .map_err(|e| Error::Config(format!("Redis CA file {}: {e}", path.display())))
            })
            .transpose()?;
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert,
        };
        info = redis::Client::build_with_tls(info, certificates)
            .map_err(|e| bad(&e))?
            .get_connection_info()
            .clone();
    } else if ca_file.is_some() {
        return Err(Error::Config(format!(
            "a CA file only applies to TLS (rediss://) URLs, not {}",
            redacted(url)
        )));
    }
    let limit = Duration::from_secs(5);
    let connection = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_response_timeout(Some(limit * 2));
    let manager = Manager::new_with_config(info, connection).map_err(|e| bad(&e))?;
    Pool::builder(manager)
        .max_size(64)
        .wait_timeout(Some(limit))
        .create_timeout(Some(limit))
        .recycle_timeout(Some(limit))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| Error::Config(format!("redis pool: {e}")))
}

/// One round trip, to turn "unreachable", "wrong password" and the like into an error at start.
pub async fn ping(pool: &Pool) -> Result<()> {
    let mut conn = pool.get().await.map_err(unavailable)?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map(drop)
        .map_err(unavailable)
}

/// Counts one client round trip to Redis on a hot path (the throughput harness reports them
/// per job).
pub(super) fn round_trip(op: &'static str) {
    metrics::counter!(crate::metrics::REDIS_ROUND_TRIPS, "op" => op).increment(1);
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("redis: {e}"))
}

/// A reply that does not decode: permanent (asking again gets the same reply).
pub(super) fn garbage(what: impl std::fmt::Display) -> Error {
    Error::Backend(format!("redis: {what}"))
}

/// Classifies a Redis error by what the caller should do (redis-rs' `RetryMethod`, plus the
/// server's "not now" codes it leaves to the caller): connection trouble and `LOADING`,
/// `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `READONLY`, `OOM` are transient; a script error, a
/// protocol error or a reply of the wrong shape is permanent.
fn classify(e: &redis::RedisError) -> Error {
    let transient_code = matches!(
        e.code(),
        Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "OOM" | "CLUSTERDOWN")
    );
    let transient = transient_code
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.retry_method(),
            RetryMethod::Reconnect
                | RetryMethod::RetryImmediately
                | RetryMethod::WaitAndRetry
                | RetryMethod::RefreshSlotsAndRetry
                | RetryMethod::ReconnectFromInitialConnections
        );
    if transient {
        unavailable(e)
    } else {
        garbage(e)
    }
}

pub(super) fn parse<T: std::str::FromStr>(s: &str) -> Result<T> {
    s.parse()
        .map_err(|_| garbage(format_args!("unexpected value {s:?}")))
}

/// One multiplexed connection shared by all operations of a store. Concurrent requests are
/// pipelined over it, and no operation pays a pool checkout (deadpool pings Redis on every
/// checkout, which would double the round trips). A connection-level error drops it; the next
/// operation connects afresh through the pool.
#[derive(Clone)]
pub(super) struct Link {
    pool: Pool,
    shared: Arc<std::sync::Mutex<Option<MultiplexedConnection>>>,
}

impl Link {
    pub(super) fn new(pool: Pool) -> Self {
        Self {
            pool,
            shared: Arc::default(),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) async fn get(&self) -> Result<MultiplexedConnection> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let conn = deadpool_redis::Connection::take(self.pool.get().await.map_err(unavailable)?);
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Classifies a Redis error, forgetting the connection if the error says it is unusable.
    pub(super) fn broken(&self, e: redis::RedisError) -> Error {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
        {
            *self.slot() = None;
        }
        classify(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redacted("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redacted("redis://app:s3cret@host/1"),
            "redis://app:***@host/1"
        );
        assert_eq!(redacted("rediss://token@host"), "rediss://***@host");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("u:pw123@127.0.0.1:6405"), "u:***@127.0.0.1:6405");
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?db=2&pass=s3cret&password=x"),
            "redis+unix:///run/redis.sock?db=2&pass=***&password=***"
        );
        let err = pool("redis://:s3cret@host:notaport")
            .err()
            .unwrap()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("invalid Redis URL"), "{err}");
    }
}
