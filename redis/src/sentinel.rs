//! Redis behind Sentinel: the master is asked of the sentinels, checked (`ROLE`), and asked
//! again whenever the connection to it breaks or it answers `READONLY` — so a failover is
//! followed without a restart, and no connection to a demoted master is kept.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use deadpool_redis::redis::{self, ConnectionAddr, IntoConnectionInfo, TlsMode};

use super::link::{redacted, tls_certificates, Unready};
use crate::error::{Error, Result};

/// A Redis master found through its sentinels (see [`sentinel`]).
#[derive(Clone)]
pub struct Sentinel {
    client: Arc<tokio::sync::Mutex<SentinelClient>>,
    config: redis::AsyncConnectionConfig,
    shown: String,
    shared: Arc<std::sync::Mutex<Option<MultiplexedConnection>>>,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel")
            .field("url", &self.shown)
            .finish()
    }
}

/// How long asking the sentinels and checking the master may take: redis-rs' check of the
/// master's role has no timeout of its own, and a blackholed master must not hang a worker.
const DISCOVERY: Duration = Duration::from_secs(5);

impl Sentinel {
    pub(super) fn slot(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The shared connection to the master, found on first use and after [`Self::slot`] is
    /// cleared.
    pub(super) async fn connection(&self) -> std::result::Result<MultiplexedConnection, Unready> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        // One discovery for every caller waiting here: who gets the lock second finds the
        // connection the first one made.
        let mut client = self.client.lock().await;
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let conn = self.discover(&mut client).await?;
        Ok(self.slot().get_or_insert(conn).clone())
    }

    /// A new connection of its own to the master the sentinels name now.
    pub(super) async fn connect(&self) -> std::result::Result<MultiplexedConnection, Unready> {
        // The lock serialises discovery: redis-rs caches its sentinel connections.
        let mut client = self.client.lock().await;
        self.discover(&mut client).await
    }

    async fn discover(
        &self,
        client: &mut SentinelClient,
    ) -> std::result::Result<MultiplexedConnection, Unready> {
        let found = tokio::time::timeout(DISCOVERY, async {
            let client = client.async_get_client().await?;
            client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
        })
        .await;
        match found {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(Unready::Redis(format!("sentinel {}: ", self.shown), e)),
            Err(_) => Err(Unready::Silent(format!(
                "sentinel {}: no master found within {DISCOVERY:?}",
                self.shown
            ))),
        }
    }
}

/// A Redis master behind Sentinel, from
/// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/master-name[/db]`
/// (`rediss+sentinel://` for TLS to the sentinels and the master, trusting the PEM authority
/// in `ca_file` if given; port 26379 by default). The credentials are the master's; a
/// `?sentinel_password=` (and `sentinel_username=`) authenticates to the sentinels. Nothing
/// connects until the first operation.
pub fn sentinel(url: &str, ca_file: Option<&Path>) -> Result<Sentinel> {
    let shown = redacted(url);
    let bad =
        |e: &dyn std::fmt::Display| Error::Config(format!("invalid Sentinel URL {shown}: {e}"));
    let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
        (true, rest)
    } else {
        return Err(bad(&"expected redis+sentinel:// or rediss+sentinel://"));
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let (hosts, path) = rest
        .split_once('/')
        .ok_or_else(|| bad(&"no master name (…/master-name)"))?;
    let (name, db) = path.split_once('/').unwrap_or((path, ""));
    if name.is_empty() {
        return Err(bad(&"no master name (…/master-name)"));
    }
    let db: i64 = match db {
        "" => 0,
        db => db
            .parse()
            .map_err(|_| bad(&format_args!("bad database {db:?}")))?,
    };
    let scheme = if tls { "rediss" } else { "redis" };
    // Each part is parsed by redis-rs as a URL of its own, so credentials are percent-decoded
    // and hosts checked as for any Redis URL.
    let parse = |userinfo: Option<&str>, host: &str| {
        // `h:port`, `[v6]:port`; without a port, the sentinels' own (26379).
        let has_port = match host.strip_prefix('[') {
            Some(v6) => v6
                .split_once(']')
                .is_some_and(|(_, rest)| rest.starts_with(':')),
            None => host.contains(':'),
        };
        let host = match has_port {
            true => host.to_owned(),
            false => format!("{host}:26379"),
        };
        let at = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        format!("{scheme}://{at}{host}")
            .into_connection_info()
            .map_err(|e| bad(&e))
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',').map(str::trim) {
        if host.is_empty() {
            return Err(bad(&"an empty host"));
        }
        let addr = parse(None, host)?.addr().clone();
        sentinels.push(match addr {
            // Certificates are set by the builder below; verification stays on.
            ConnectionAddr::TcpTls { host, port, .. } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
            other => other,
        });
    }
    let master = parse(userinfo, hosts.split(',').next().unwrap_or_default())?;
    let mut builder = SentinelClientBuilder::new(sentinels, name, SentinelServerType::Master)
        .map_err(|e| bad(&e))?
        .set_client_to_redis_db(db);
    if let Some(user) = master.redis_settings().username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = master.redis_settings().password() {
        builder = builder.set_client_to_redis_password(password);
    }
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        builder = match &*key {
            "sentinel_username" => builder.set_client_to_sentinel_username(value),
            "sentinel_password" => builder.set_client_to_sentinel_password(value),
            other => return Err(bad(&format_args!("unknown parameter {other:?}"))),
        };
    }
    if tls {
        let certificates = tls_certificates(ca_file)?;
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure)
            .set_client_to_redis_certificates(certificates.clone())
            .set_client_to_sentinel_certificates(certificates);
    } else if ca_file.is_some() {
        return Err(bad(&"a CA file only applies to TLS (rediss+sentinel://)"));
    }
    let client = builder.build().map_err(|e| bad(&e))?;
    let limit = Duration::from_secs(5);
    Ok(Sentinel {
        client: Arc::new(tokio::sync::Mutex::new(client)),
        config: redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(limit))
            .set_response_timeout(Some(limit * 2)),
        shown,
        shared: Arc::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_with_one_line() {
        let err = |url: &str| sentinel(url, None).unwrap_err().to_string();
        assert!(err("redis://h/x").contains("expected redis+sentinel://"));
        assert!(err("redis+sentinel://h1,h2").contains("no master name"));
        assert!(err("redis+sentinel://h1,h2/").contains("no master name"));
        assert!(err("redis+sentinel://h1,,h2/m").contains("an empty host"));
        assert!(err("redis+sentinel://h1/m/zero").contains("bad database"));
        assert!(err("redis+sentinel://h1/m?color=red").contains("unknown parameter"));
        let secret = err("redis+sentinel://:s3cret@h1:notaport/m");
        assert!(!secret.contains("s3cret"), "{secret}");
        let secret = sentinel("redis+sentinel://h1/m?sentinel_password=s3cret&bad=1", None)
            .unwrap_err()
            .to_string();
        assert!(!secret.contains("s3cret"), "{secret}");
        assert!(sentinel(
            "redis+sentinel://:pw@h1,h2:26380,[::1]:26381,[::1]/mymaster/2",
            None
        )
        .is_ok());
        let ca = sentinel("redis+sentinel://h1/m", Some(Path::new("/nonexistent")));
        assert!(ca.unwrap_err().to_string().contains("only applies to TLS"));
    }
}
