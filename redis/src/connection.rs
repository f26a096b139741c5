//! The connection to Redis: URL parsing (TLS, passwords redacted), the pool or the cluster
//! client, one shared multiplexed connection per store, and the classification of Redis
//! errors by what the caller should do.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::cluster::{ClusterClient, ClusterClientBuilder};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::{self, RetryMethod};
use deadpool_redis::{Manager, Pool, Runtime};

pub use super::link::redacted;
pub(super) use super::link::unavailable;
use super::link::{tls_certificates, Unready};
use super::sentinel::Sentinel;
use crate::error::{Error, Result};

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
        info = redis::Client::build_with_tls(info, tls_certificates(ca_file)?)
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

/// A Redis Cluster, reached through any of its nodes (`redis://[user:password@]host:port`
/// each; the client learns the rest of the topology from them and follows it through
/// resharding and failover). Nothing connects until the first operation (see [`ping`]).
///
/// Its connection is redis-rs' cluster connection, which multiplexes every request over one
/// connection per node and follows the topology on its own: a pool would add nothing, and
/// every store on one `Cluster` shares it. The client retries nothing: a request may have
/// run before its connection broke, and the scripts are not all safe to run twice (a
/// repeated claim would grant leases nobody holds). An error reaches the caller at once —
/// during a failover, `Unavailable` until the replica is promoted — and the callers retry
/// with back-off (workers, renewals and settlements all do).
#[derive(Clone)]
pub struct Cluster {
    client: Arc<ClusterClient>,
    shown: String,
    shared: Arc<std::sync::Mutex<Option<ClusterConnection>>>,
}

impl Cluster {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<ClusterConnection>> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The shared connection, made on first use.
    async fn connection(&self) -> std::result::Result<ClusterConnection, Unready> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let conn = self.connect().await?;
        Ok(self.slot().get_or_insert(conn).clone())
    }

    /// A new connection of its own.
    async fn connect(&self) -> std::result::Result<ClusterConnection, Unready> {
        // (The caller names the nodes; `shown` is for Debug.)
        self.client
            .get_async_connection()
            .await
            .map_err(|e| Unready::Redis("cluster: ".into(), e))
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("nodes", &self.shown)
            .finish()
    }
}

/// A [`Cluster`] reached through `nodes` (see [`cluster_with_ca`]).
pub fn cluster<S: AsRef<str>>(nodes: &[S]) -> Result<Cluster> {
    cluster_with_ca(nodes, None)
}

/// A [`Cluster`] reached through `nodes`: all `redis://`, or all `rediss://` for TLS to every
/// node (trusting the PEM authority in `ca_file`, otherwise the system's trust store). The
/// cluster must announce its TLS ports (`tls-cluster yes`), since the client follows the
/// addresses the nodes give.
pub fn cluster_with_ca<S: AsRef<str>>(
    nodes: &[S],
    ca_file: Option<&std::path::Path>,
) -> Result<Cluster> {
    let shown = nodes
        .iter()
        .map(|n| redacted(n.as_ref()))
        .collect::<Vec<_>>()
        .join(",");
    let bad = |e: &dyn std::fmt::Display| {
        Error::Config(format!("invalid Redis Cluster nodes {shown}: {e}"))
    };
    if nodes.is_empty() {
        return Err(bad(&"no node given"));
    }
    let mut infos = Vec::with_capacity(nodes.len());
    for node in nodes {
        infos.push(
            redis::IntoConnectionInfo::into_connection_info(node.as_ref()).map_err(|e| bad(&e))?,
        );
    }
    let tls = nodes
        .iter()
        .filter(|n| n.as_ref().starts_with("rediss://"))
        .count();
    if tls != 0 && tls != nodes.len() {
        return Err(bad(
            &"some nodes are rediss:// and some redis://: use one for all",
        ));
    }
    let limit = Duration::from_secs(5);
    let mut builder = ClusterClientBuilder::new(infos)
        .connection_timeout(limit)
        .response_timeout(limit * 2)
        .retries(0);
    if tls > 0 {
        builder = builder
            .tls(redis::TlsMode::Secure)
            .certs(tls_certificates(ca_file)?);
    } else if ca_file.is_some() {
        return Err(bad(&"a CA file only applies to TLS (rediss://) nodes"));
    }
    let client = builder.build().map_err(|e| bad(&e))?;
    Ok(Cluster {
        client: Arc::new(client),
        shown,
        shared: Arc::default(),
    })
}

/// The Redis a store talks to: one server, through a connection [`Pool`], a [`Cluster`], or
/// a master found through its [`Sentinel`]s.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Target {
    /// One Redis server (or a primary with replicas behind one address).
    Server(Pool),
    /// A Redis Cluster.
    Cluster(Cluster),
    /// The master of a group watched by Redis Sentinel.
    Sentinel(Sentinel),
}

impl From<Sentinel> for Target {
    fn from(sentinel: Sentinel) -> Self {
        Self::Sentinel(sentinel)
    }
}

impl Target {
    /// Forgets the connection shared by every link to this target, so the next operation
    /// connects (and, behind Sentinel, asks for the master) afresh.
    fn forget_shared(&self) {
        match self {
            Self::Server(_) => {}
            Self::Cluster(cluster) => *cluster.slot() = None,
            Self::Sentinel(sentinel) => *sentinel.slot() = None,
        }
    }
}

impl From<Pool> for Target {
    fn from(pool: Pool) -> Self {
        Self::Server(pool)
    }
}

impl From<&Pool> for Target {
    fn from(pool: &Pool) -> Self {
        Self::Server(pool.clone())
    }
}

impl From<&Target> for Target {
    fn from(target: &Target) -> Self {
        target.clone()
    }
}

impl From<Cluster> for Target {
    fn from(cluster: Cluster) -> Self {
        Self::Cluster(cluster)
    }
}

/// One round trip (to every node of a cluster), to turn "unreachable", "wrong password" and
/// the like into an error at start.
pub async fn ping(target: impl Into<Target>) -> Result<()> {
    probe(target.into()).await.map_err(Error::from)
}

async fn probe(target: Target) -> std::result::Result<(), Unready> {
    // A pooled connection is borrowed, not taken, and the cluster's shared one is used, so a
    // readiness probe that pings every second opens no connection per ping.
    let ping = redis::cmd("PING");
    let pong = match target {
        Target::Server(pool) => {
            let mut conn = pool.get().await.map_err(|e| match e {
                deadpool_redis::PoolError::Backend(e) => Unready::Redis(String::new(), e),
                deadpool_redis::PoolError::Timeout(_) => Unready::Silent(e.to_string()),
                other => Unready::Failed(unavailable(other)),
            })?;
            ping.query_async::<String>(&mut conn).await
        }
        Target::Cluster(cluster) => {
            let mut conn = cluster.connection().await?;
            let pong = ping.query_async::<String>(&mut conn).await;
            if pong.is_err() {
                *cluster.slot() = None;
            }
            pong
        }
        Target::Sentinel(sentinel) => {
            // ROLE, not PING: a master demoted while this connection stayed open still
            // answers PING; the probe forgets it so the next operation asks the sentinels.
            let mut conn = sentinel.connection().await?;
            let role = redis::cmd("ROLE")
                .query_async::<redis::Value>(&mut conn)
                .await;
            let master = match &role {
                Ok(redis::Value::Array(parts)) => matches!(
                    parts.first(),
                    Some(redis::Value::BulkString(b)) if b.as_slice() == b"master"
                ),
                _ => false,
            };
            if !master {
                *sentinel.slot() = None;
            }
            match role {
                Err(e) => Err(e),
                Ok(_) if !master => return Err(Unready::Demoted),
                Ok(_) => Ok("PONG".to_owned()),
            }
        }
    };
    pong.map(drop).map_err(|e| Unready::Redis(String::new(), e))
}

/// [`ping`], waiting out a server that is there but not ready — loading its data after a
/// restart, busy with a script, a master or cluster not settled yet, a handshake left
/// unanswered — for up to `patience`: a worker started beside its Redis (a host reboot, a
/// deploy of both, a restart while Redis loads its append-only file) waits for it instead of
/// exiting. A refused connection or a wrong setting still fails at once.
pub async fn ping_until_ready(target: impl Into<Target>, patience: Duration) -> Result<()> {
    let target = target.into();
    let deadline = tokio::time::Instant::now().checked_add(patience);
    let waiting = || deadline.is_none_or(|d| tokio::time::Instant::now() < d);
    loop {
        match probe(target.clone()).await {
            Err(unready) if unready.not_now() && waiting() => {
                let why = Error::from(unready);
                crate::repeats::warn_repeated!(error = %why, "Redis is not ready yet; waiting");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            done => return done.map_err(Error::from),
        }
    }
}

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag (the text between the first
/// `{` and the next `}`, if not empty) or of the whole key, modulo 16384 — as the server
/// computes it.
pub(super) fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16384
}

/// A hash tag of slot `slot` (< 16384): the smallest decimal number that hashes there, so
/// the sink's per-slot records on a cluster have fixed, readable names.
pub(super) fn slot_tag(slot: u16) -> &'static str {
    static TAGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        let mut tags = vec![String::new(); 16384];
        let mut missing = tags.len();
        // Every slot is hit within the first few hundred thousand numbers.
        for n in 0u32.. {
            let tag = n.to_string();
            let slot = usize::from(key_slot(&tag));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        tags
    });
    &TAGS[usize::from(slot % 16384)]
}

/// Counts one client round trip to Redis on a hot path (the throughput harness reports them
/// per job).
pub(super) fn round_trip(op: &'static str) {
    metrics::counter!(crate::metrics::REDIS_ROUND_TRIPS, "op" => op).increment(1);
}

/// A reply that does not decode: permanent (asking again gets the same reply).
pub(super) fn garbage(what: impl std::fmt::Display) -> Error {
    Error::Backend(format!("redis: {what}"))
}

/// Classifies a Redis error by what the caller should do (redis-rs' `RetryMethod`, plus the
/// server's "not now" codes it leaves to the caller): connection trouble and `LOADING`,
/// `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `READONLY`, `OOM` are transient, and so are a cluster's
/// `MOVED` and `ASK` (a slot moved or moving: the client, which follows no redirect itself,
/// learns the new owner and the same request goes there later); a script error, a protocol
/// error or a reply of the wrong shape is permanent.
fn classify(e: &redis::RedisError) -> Error {
    // A process of another layout generation (`common.lua`, `wrong_layout`).
    if e.code() == Some("PALISADE_LAYOUT") {
        return Error::Layout(format!(
            "PALISADE_LAYOUT {}",
            e.detail().unwrap_or_default()
        ));
    }
    // A process whose build cannot read the installation's format level (`wrong_format`).
    if e.code() == Some("PALISADE_FORMAT") {
        return Error::Format(format!(
            "PALISADE_FORMAT {}",
            e.detail().unwrap_or_default()
        ));
    }
    let transient_code = matches!(
        e.code(),
        Some(
            "LOADING"
                | "BUSY"
                | "TRYAGAIN"
                | "MASTERDOWN"
                | "READONLY"
                | "OOM"
                | "CLUSTERDOWN"
                | "MOVED"
                | "ASK"
        )
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

/// A connection to a server or to a cluster; requests to a cluster are routed by their first
/// key (a script's KEYS[1]).
#[derive(Clone)]
pub(super) enum Conn {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Server(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Server(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// `WAIT replicas timeout`: blocks until `replicas` replicas of the primary serving `key`
    /// have every write this connection sent it, or `timeout` passes; how many did. On a
    /// cluster it goes to that key's primary alone (redis-rs would ask every primary).
    pub(super) async fn wait_replicas(
        &mut self,
        key: &str,
        replicas: usize,
        timeout: Duration,
    ) -> redis::RedisResult<usize> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis() as u64);
        match self {
            Self::Server(c) => wait.query_async(c).await,
            Self::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let reply = c
                    .route_command(
                        wait,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                Ok(redis::from_redis_value(reply)?)
            }
        }
    }
}

/// One multiplexed connection shared by all operations of a store. Concurrent requests are
/// pipelined over it, and no operation pays a pool checkout (deadpool pings Redis on every
/// checkout, which would double the round trips). A connection-level error drops it; the next
/// operation connects afresh.
#[derive(Clone)]
pub(super) struct Link {
    target: Target,
    shared: Arc<std::sync::Mutex<Option<Conn>>>,
    /// On a cluster: a connection of this link's own instead of the cluster's shared one.
    own: bool,
}

impl Link {
    pub(super) fn new(target: Target) -> Self {
        Self {
            target,
            shared: Arc::default(),
            own: false,
        }
    }

    /// A link with a connection nothing else uses (for commands that block their
    /// connection, like WAIT).
    pub(super) fn dedicated(target: Target) -> Self {
        Self {
            own: true,
            ..Self::new(target)
        }
    }

    pub(super) fn target(&self) -> &Target {
        &self.target
    }

    /// Whether this is a Redis Cluster, where a script may only touch keys of one slot.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Conn>> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) async fn get(&self) -> Result<Conn> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let conn = match &self.target {
            Target::Server(pool) => Conn::Server(deadpool_redis::Connection::take(
                pool.get().await.map_err(unavailable)?,
            )),
            Target::Cluster(cluster) if self.own => Conn::Cluster(cluster.connect().await?),
            Target::Cluster(cluster) => Conn::Cluster(cluster.connection().await?),
            Target::Sentinel(sentinel) if self.own => Conn::Server(sentinel.connect().await?),
            Target::Sentinel(sentinel) => Conn::Server(sentinel.connection().await?),
        };
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Classifies a Redis error, forgetting the connection if the error says it is unusable —
    /// broken, or to a server that is no longer the master (`READONLY`: after a failover the
    /// demoted master keeps answering; a connection kept to it would never write again).
    pub(super) fn broken(&self, e: redis::RedisError) -> Error {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
            || e.code() == Some("READONLY")
        {
            *self.slot() = None;
            if !self.own {
                self.target.forget_shared();
            }
        }
        classify(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reply, as redis-rs decodes it.
    fn server_error(reply: &str) -> redis::RedisError {
        redis::parse_redis_value(reply.as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    /// A cluster's redirects are transient: the request goes to the slot's new owner later
    /// (found: `ASK` during a slot's migration reached a fenced write as a permanent error).
    #[test]
    fn redirects_are_transient_and_script_errors_permanent() {
        for reply in [
            "-MOVED 3999 127.0.0.1:6381\r\n",
            "-ASK 3999 127.0.0.1:6381\r\n",
            "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
        ] {
            assert!(classify(&server_error(reply)).is_retryable(), "{reply}");
        }
        let script = "-ERR user_script:1: Script attempted to access a non local key\r\n";
        assert!(!classify(&server_error(script)).is_retryable());
    }

    #[test]
    fn readiness_is_decided_on_codes_and_kinds() {
        let redis = |e| Unready::Redis(String::new(), e);
        for reply in [
            "-LOADING Redis is loading the dataset in memory\r\n",
            "-BUSY Redis is busy running a script\r\n",
            "-MASTERDOWN Link with MASTER is down\r\n",
            "-CLUSTERDOWN The cluster is down\r\n",
            "-TRYAGAIN Multiple keys request during rehashing\r\n",
        ] {
            assert!(redis(server_error(reply)).not_now(), "{reply}");
        }
        let io = |kind| redis(std::io::Error::from(kind).into());
        assert!(io(std::io::ErrorKind::TimedOut).not_now());
        assert!(Unready::Silent("pool checkout timed out".into()).not_now());
        assert!(Unready::Demoted.not_now());
        // Wrong settings: said at once, whatever their text says.
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
        ] {
            assert!(!io(kind).not_now(), "{kind:?}");
        }
        for reply in [
            "-WRONGPASS invalid username-password pair\r\n",
            "-NOAUTH Authentication required (loading is not the point)\r\n",
            "-ERR busy doing something else\r\n",
        ] {
            assert!(!redis(server_error(reply)).not_now(), "{reply}");
        }
        assert!(!Unready::Failed(Error::Config("x".into())).not_now());
        // The causes redis-rs wraps keep only their text: read there, and only there.
        let wrapped = |desc, detail: &str| {
            redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                desc,
                detail.to_owned(),
            )))
        };
        let cluster = "Failed to create initial connections";
        let select = "Redis server refused to switch database";
        assert!(wrapped(cluster, "Io: timed out").not_now());
        assert!(wrapped(cluster, "BusyLoading: Redis is loading the dataset").not_now());
        assert!(wrapped(
            select,
            "Redis is busy running a script. You can only call SCRIPT KILL"
        )
        .not_now());
        assert!(wrapped(select, "Redis is loading the dataset in memory").not_now());
        assert!(!wrapped(cluster, "Io: Connection refused (os error 111)").not_now());
        assert!(!wrapped(select, "DB index is out of range").not_now());
        assert!(!wrapped("Something else", "timed out").not_now());
    }

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot("123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(
            key_slot("foo{}{bar}"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % 16384
        );
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        for slot in [0, 1, 5000, 16383] {
            assert_eq!(key_slot(&format!("x:{{{}}}:y", slot_tag(slot))), slot);
        }
    }

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
        assert_eq!(
            redacted("redis+sentinel://h1,h2/m?sentinel_password=s3cret&sentinel_username=u"),
            "redis+sentinel://h1,h2/m?sentinel_password=***&sentinel_username=u"
        );
        let err = pool("redis://:s3cret@host:notaport")
            .err()
            .unwrap()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("invalid Redis URL"), "{err}");
    }
}
