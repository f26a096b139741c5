//! Fenced Postgres: the admission rule of ARCHITECTURE.md §4 inside the user's own database, in the
//! same transaction as the user's own SQL.
//!
//! Every fenced transaction runs these steps on one connection, under READ COMMITTED, in
//! three round trips of its own (BEGIN; steps 1 and 2 with the advance; the key record with
//! COMMIT) plus the closure's statements:
//!
//! 1. **Lock or create the scope's fence row**: `INSERT .. ON CONFLICT (scope) DO UPDATE ..
//!    RETURNING token, lease`. The statement waits for any other writer of the scope and then
//!    holds the row lock until commit, so the very first write of a scope is serialised too
//!    (two writers racing to create the row meet at the unique index).
//! 2. **Read the rest of the facts** — the published low watermark and whether the
//!    idempotency key was applied — in a *second* statement. Under READ COMMITTED each
//!    statement sees what was committed when it started, so this one sees every key and
//!    watermark committed by whoever held the lock before us; read in step 1's statement, it
//!    could miss them (its snapshot predates the wait for the lock). The same statement
//!    advances the fence to the write's token (strictly upwards) ahead of the decision. Both
//!    statements go out together and the server runs them in order, so the pipeline keeps
//!    both snapshots and costs one round trip.
//! 3. **Decide** with [`admission::decide`], the one rule every
//!    backend uses. A refusal rolls the transaction back: nothing changed, not even the row
//!    step 1 created, nor the advance.
//! 4. **Apply** — the user's closure ([`PostgresSink::transaction`]) or a `Mutation` list
//!    ([`PostgresFencedStore`]) — then record the key (with the closure's result) and
//!    commit, sent together. The fence was advanced before the closure ran, so even a closure
//!    that ends the transaction itself leaves the fence advanced; the record then fails, and
//!    whatever the closure began afterwards is rolled back.
//! 5. **A write refused for its content** (a mutation list that does not fit, a closure that
//!    fails, or the server refusing the last step: a deferred constraint at COMMIT, a closure
//!    that returned Ok from an aborted transaction) rolls its own work back — and with it the
//!    fence advance of step 2. The writer
//!    passed the ownership checks, so its token must still fence older leases out
//!    ([`admission::advance`]): a short second transaction locks the fence row again,
//!    decides again (the facts may have moved meanwhile) and advances the fence strictly by
//!    token, recording no key. Only the failure path pays for it; a savepoint around every
//!    closure would cost two more round trips on the hot path. If the connection died, the
//!    closure's error is returned and the advance is best-effort: the next write of a newer
//!    lease, or the coordinator's watermark, fences the scope then.
//!
//! Collection: a process that learns a higher watermark publishes it in `meta` and, in the
//! same statement, deletes a bounded number of fence rows below it and of keys past their
//! retention (`FOR UPDATE SKIP LOCKED`: never waits for a writer, never a long lock). A
//! writer that waited on a row the collector deleted creates it afresh and then, in step 2,
//! reads the raised watermark: the `admission` module's proof carries over unchanged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::admission::{self, Admission, Fence, Rejection};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, IdempotencyKey, LeaseId, Scope};

// The core's modules, so this crate's files name them as they did inside one crate.
pub(crate) use palisade_core::*;

mod epoch;
mod fenced;
mod migrate;
pub mod outbox;
mod protocol;
#[doc(hidden)] // palisade-cli's flag checks
pub mod tls;

use protocol::{Param, Protocol};

pub use epoch::PostgresEpochSource;
pub use fenced::PostgresFencedStore;
pub use migrate::{MigrationPlan, PendingMigration};
#[doc(hidden)] // the relay's
pub use outbox::OutboxEntry;
pub use outbox::{OutboxCounts, OutboxWriter};

/// Whether connecting a [`PostgresSink`] brings its schema up to this build's version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Migrations {
    /// Apply the migrations this build knows and the schema lacks (under a lock, each once),
    /// as every worker does by default.
    #[default]
    Apply,
    /// Apply nothing: refuse to connect unless the schema already has every migration this
    /// build needs (an operator ran `palisade migrate --apply`, or [`migrate`]). For fleets
    /// whose workers may not change the schema (`worker --no-migrate`).
    Check,
}

/// Where the sink schema at `url` stands against this build: its version, the migrations
/// [`migrate`] would apply with their SQL, and whether this build can run against it.
/// Changes nothing.
pub async fn migration_plan(url: &str) -> Result<MigrationPlan> {
    let Extras { url, schema, .. } = split_schema(url)?;
    let schema = checked_schema(&schema)?;
    let (pool, _) = pool(&url, 1)?;
    migrate::plan(&pool, &schema).await
}

/// Applies the migrations this build knows to the sink schema at `url` and returns the plan
/// it carried out (what was pending is now applied). Fails, changing nothing, when the
/// schema is newer than this build can run against.
pub async fn migrate(url: &str) -> Result<MigrationPlan> {
    let Extras { url, schema, .. } = split_schema(url)?;
    let schema = checked_schema(&schema)?;
    let (pool, _) = pool(&url, 1)?;
    migrate::run(&pool, &schema).await
}

/// What a closure given to [`PostgresSink::transaction`] may fail with: its own error type or
/// a `tokio_postgres::Error`, both through `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The closure of a fenced transaction: given the transaction, it returns a future of its
/// result, borrowing the transaction (`|tx| Box::pin(async move { .. })`).
pub trait TransactionFn<R>:
    for<'t> FnOnce(&'t FencedTx<'t>) -> BoxFuture<'t, Result<R, BoxError>> + Send
{
}

impl<R, F> TransactionFn<R> for F where
    F: for<'t> FnOnce(&'t FencedTx<'t>) -> BoxFuture<'t, Result<R, BoxError>> + Send
{
}

/// The outcome of a fenced transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fenced<R> {
    /// The closure ran and its transaction committed; its result.
    Applied(R),
    /// The key was applied before (by this generation or an earlier one): the closure did not
    /// run; the result recorded when it did.
    Duplicate(R),
    /// The writer no longer owns the scope: the closure did not run, nothing changed.
    Rejected(Rejection),
}

impl<R> Fenced<R> {
    /// The admission, without the result.
    pub fn admission(&self) -> Admission {
        match self {
            Self::Applied(_) => Admission::Applied,
            Self::Duplicate(_) => Admission::Duplicate,
            Self::Rejected(r) => Admission::Rejected(r.clone()),
        }
    }

    /// The result of an applied or duplicate transaction, the rejection otherwise — so a
    /// handler can write `pg.transaction(..).await?.accepted()?`.
    pub fn accepted(self) -> Result<R, Rejection> {
        match self {
            Self::Applied(r) | Self::Duplicate(r) => Ok(r),
            Self::Rejected(r) => Err(r),
        }
    }
}

/// A fenced sink in a Postgres database: fence rows, idempotency keys and the outbox in one
/// schema (default `palisade`), created and upgraded by embedded, versioned migrations.
///
/// Handlers reach it through `JobContext::postgres`; a
/// [`PostgresFencedStore`] over the same schema serves `ctx.sink(..)` `Mutation` writes.
pub struct PostgresSink {
    pool: deadpool_postgres::Pool,
    /// How its hot statements reach the server (`?pooler=`).
    protocol: Protocol,
    schema: String,
    sql: Statements,
    retention: Duration,
    /// Largest watermark observed, and largest one this process has published (0: none).
    observed: AtomicU64,
    published: AtomicU64,
    /// When this process last collected (ms since `started`), and how often it may.
    started: Instant,
    swept_ms: AtomicU64,
    collect_every: Duration,
}

/// What `url` says beside libpq's own parameters.
struct Extras {
    /// libpq's URL, with ours taken out.
    url: String,
    schema: String,
    pool_size: usize,
}

/// Parses `url`, taking out the `schema` and `pool_size` query parameters (which libpq does
/// not know).
fn split_schema(url: &str) -> Result<Extras> {
    let mut extras = Extras {
        url: url.to_owned(),
        schema: "palisade".to_owned(),
        pool_size: PostgresSink::DEFAULT_POOL_SIZE,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok(extras);
    };
    let mut rest = Vec::new();
    for pair in query.split('&') {
        if let Some(name) = pair.strip_prefix("schema=") {
            extras.schema = name.to_owned();
        } else if let Some(n) = pair.strip_prefix("pool_size=") {
            extras.pool_size = n
                .parse()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "Postgres pool_size {n:?}: use a number from 1 to 1000"
                    ))
                })?;
        } else {
            rest.push(pair);
        }
    }
    extras.url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok(extras)
}

/// A schema name we can splice into SQL: an unquoted Postgres identifier, lower case.
fn checked_schema(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(format!("\"{name}\""))
    } else {
        Err(Error::Config(format!(
            "Postgres schema {name:?}: use 1-63 lower-case letters, digits and '_', not starting \
             with a digit"
        )))
    }
}

/// A pool for `url` (`postgres://…`, TLS by its `sslmode` and `sslrootcert`: see the `tls`
/// module), checked for syntax only; connections open lazily.
pub(crate) fn pool(url: &str, max_size: usize) -> Result<(deadpool_postgres::Pool, Protocol)> {
    let (url, protocol) = split_pooler(url)?;
    let (url, tls) = tls::split_tls(&url)?;
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| Error::Config(format!("invalid Postgres URL: {e}")))?;
    // A Unix socket carries no TLS (libpq ignores sslmode there), and rustls could not name
    // its server: those connections go plain.
    let unix_only = !config.get_hosts().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let tls = match unix_only {
        true => tls::Tls {
            mode: tls::SslMode::Disable,
            root_cert: None,
        },
        false => tls,
    };
    config.ssl_mode(tls.pg_mode());
    // A process paused inside a fenced transaction holds its scope's fence row lock; the
    // server ends such a transaction after a minute idle, so the next holder does not wait
    // forever (unless the URL sets its own value).
    // (A transaction pooler takes no session options: PgBouncer refuses the connection unless
    // told to ignore them, and its own idle_transaction_timeout does this job there.)
    let options = config.get_options().unwrap_or_default().to_owned();
    if !options.contains("idle_in_transaction_session_timeout") && protocol == Protocol::Cached {
        config.options(format!("{options} -c idle_in_transaction_session_timeout=60000").trim());
    }
    let manager_config = deadpool_postgres::ManagerConfig {
        recycling_method: deadpool_postgres::RecyclingMethod::Fast,
    };
    let manager = match tls.connector()? {
        Some(tls) => deadpool_postgres::Manager::from_config(config, tls, manager_config),
        None => {
            deadpool_postgres::Manager::from_config(config, tokio_postgres::NoTls, manager_config)
        }
    };
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(max_size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| Error::Config(format!("postgres pool: {e}")))?;
    Ok((pool, protocol))
}

/// Takes the `pooler` parameter (`protocol`) out of `url`, which libpq does not know.
fn split_pooler(url: &str) -> Result<(String, Protocol)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Protocol::default()));
    };
    let mut protocol = Protocol::default();
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("pooler=") {
            Some(value) => protocol = Protocol::parse(value)?,
            None => rest.push(pair),
        }
    }
    let url = match rest.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", rest.join("&")),
    };
    Ok((url, protocol))
}

/// Runs a start-up `step` (bringing a schema up, creating a table) against the server behind
/// `pool`, waiting up to `patience` for a server that is there but not ready: a worker started
/// beside its database (a host reboot, a deploy of both, a flaky link at start) waits for it
/// instead of exiting. A wrong address or setting still fails at once ([`not_ready`]).
///
/// Once a connection has been made, the address, credentials and certificate are known to be
/// right, so every transient failure of `step` after that is the link's, and waited out too;
/// `step` must be safe to run again (the migrations are, under their advisory lock).
pub(crate) async fn when_ready<T, F, Fut>(
    pool: &deadpool_postgres::Pool,
    patience: Duration,
    mut step: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    // (A patience too large for the clock is no deadline at all.)
    let deadline = tokio::time::Instant::now().checked_add(patience);
    let waiting = || deadline.is_none_or(|d| tokio::time::Instant::now() < d);
    let pause = || tokio::time::sleep(Duration::from_millis(200));
    loop {
        match pool.get().await {
            // (The connection goes back to the pool, for `step`.)
            Ok(_) => break,
            Err(e) if not_ready(&e) && waiting() => {
                crate::repeats::warn_repeated!(error = %pool_error(e), "Postgres is not ready yet; waiting");
                pause().await;
            }
            Err(e) => return Err(pool_error(e)),
        }
    }
    // (An attempt is not cut short: a migration may queue on the advisory lock behind other
    // hosts' migrations, and a lock held by a session whose COMMIT answer was lost goes with
    // that session, which the server ends within the idle-in-transaction timeout.)
    loop {
        match step().await {
            Err(e @ (Error::Unavailable(_) | Error::OutcomeUnknown(_))) if waiting() => {
                crate::repeats::warn_repeated!(error = %e, "Postgres link failed during start-up; trying again");
                pause().await;
            }
            done => return done,
        }
    }
}

/// Whether a failed first contact says the server is there but not ready: starting up,
/// shutting down or recovering (SQLSTATE 57P03), out of connection slots (53300), or a
/// connection it accepted and then dropped (end of file) or left unanswered (a timeout). Not a
/// refused connection, a name that does not resolve, a wrong password, database or
/// certificate, or any other server error: those are a wrong address or setting, said at once.
fn not_ready(e: &deadpool_postgres::PoolError) -> bool {
    use deadpool_postgres::PoolError;
    let e = match e {
        PoolError::Timeout(_) => return true,
        PoolError::Backend(e) => e,
        _ => return false,
    };
    if let Some(db) = e.as_db_error() {
        return matches!(db.code().code(), "57P03" | "53300");
    }
    if e.is_closed() {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind;
            // Not tokio-util's "bytes remaining on stream" (an end of file inside a message):
            // an HTTP server's reply reads as the start of a huge message cut short, and a
            // wrong port must be said at once. A reset is waited for: Postgres negotiates TLS
            // itself, so unlike Redis it is no sign of a plain client at a TLS port.
            return matches!(
                io.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::TimedOut
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::ConnectionReset
            );
        }
        cause = c.source();
    }
    false
}

/// Classifies a Postgres error by what the caller should do. tokio-postgres prints a server
/// error as just "db error", so the server's code and message are spelled out.
pub(crate) fn postgres_error(e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            let message = format!("postgres {code}: {}", db.message());
            if pooler_sqlstate(code, db.message()) {
                warn_of_a_pooler(&message);
                Error::Unavailable(format!("{message} ({POOLER_HINT})"))
            } else if transient_sqlstate(code) {
                Error::Unavailable(message)
            } else {
                Error::Backend(message)
            }
        }
        None if e.is_closed() || io_cause(&e) => {
            Error::Unavailable(format!("postgres: {}", crate::error::chain(&e)))
        }
        None => Error::Backend(format!("postgres: {}", crate::error::chain(&e))),
    }
}

/// How long the server lets a transaction sit idle: a paused process's fenced transaction
/// ends then, and with it the lock the scope's next holder waits on. Set for the session
/// (startup `options`) on a direct connection, per transaction behind a transaction pooler.
const IDLE_TIMEOUT_LOCAL: &str = "SET LOCAL idle_in_transaction_session_timeout = 60000";

/// What an error a transaction-mode pooler causes adds to its message.
const POOLER_HINT: &str = "a connection pooler in transaction mode in front of Postgres? \
    say so in the sink's URL (pooler=transaction) so that Palisade's statements go out \
    unnamed, and keep your own prepared statements inside the transaction (docs/postgres.md, \
    \"Behind a pooler\")";

/// Whether a server error is one a transaction-mode pooler (PgBouncer's `pool_mode =
/// transaction` before 1.21's `max_prepared_statements`) causes: a named prepared statement
/// that the server connection the pooler handed over does not have (26000), already has from
/// another client (42P05), or has with other parameters (08P01, "bind message supplies").
/// Such an error says nothing about the job: it is retried (`Error::Unavailable`), never a
/// dead letter for a job that would succeed on another connection, and named once in the log
/// with the fix.
fn pooler_sqlstate(code: &str, message: &str) -> bool {
    matches!(code, "26000" | "42P05" | "08P01") && names_a_driver_statement(message)
}

/// Whether `message` names one of tokio-postgres' own prepared statements (`"s<digits>"`, one
/// counter per process): a user's own `PREPARE p` or `EXECUTE p`, or the unnamed statement
/// (`""`), is the user's error and keeps its class.
fn names_a_driver_statement(message: &str) -> bool {
    message
        .split("prepared statement \"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(name, _)| name))
        .any(|name| {
            name.strip_prefix('s')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Logs, once per process, that the errors look like a transaction-mode pooler's.
fn warn_of_a_pooler(first: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            error = first,
            "postgres: {POOLER_HINT}; such errors are retried"
        );
    });
}

/// Whether a server error's SQLSTATE says "try again later": 08 connection, 40
/// serialization failure or deadlock, 53 resources, 57P shutdown or crash, 57014 statement
/// timeout, 55P03 lock not available, 25006 read-only (a replica, or a primary mid-failover).
fn transient_sqlstate(code: &str) -> bool {
    ["08", "40", "53", "57P"]
        .iter()
        .any(|c| code.starts_with(c))
        || ["55P03", "57014", "25006"].contains(&code)
}

fn io_cause(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

pub(crate) fn pool_error(e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => postgres_error(e),
        other => Error::Unavailable(format!("postgres pool: {other}")),
    }
}

/// Checks one part of a key a handler names (a transaction key, an outbox target or push
/// key): non-empty, at most 200 bytes, no `/` (the separator of the stored key, so two
/// different names can never make the same key) and no control characters (keys travel in
/// an HTTP header).
pub fn check_key_part(what: &str, part: &str) -> Result<()> {
    if part.is_empty()
        || part.len() > 200
        || part.contains('/')
        || part.chars().any(char::is_control)
    {
        return Err(Error::InvalidJob(format!(
            "{what} {part:?}: use 1-200 bytes without '/' or control characters"
        )));
    }
    Ok(())
}

/// A token as Postgres BIGINT: tokens stay below 2^63 (epochs below 2^23, ARCHITECTURE.md §2).
pub(crate) fn bigint(token: FencingToken) -> Result<i64> {
    i64::try_from(token.as_u64())
        .map_err(|_| Error::Backend(format!("token {token} does not fit a Postgres BIGINT")))
}

/// A duration as SQL milliseconds (`$n * interval '1 millisecond'`), capped at 100 years:
/// Postgres intervals overflow near 178 million years, and nothing here needs more.
pub(crate) fn sql_millis(d: Duration) -> f64 {
    d.min(Duration::from_secs(100 * 365 * 24 * 3600))
        .as_millis() as f64
}

/// The SQL, with the schema spliced in once.
struct Statements {
    lock_fence: String,
    facts: String,
    record: String,
    collect: String,
    highest: String,
    lock_data: String,
    write_data: String,
    read_data: String,
    push_outbox: String,
}

impl Statements {
    fn new(s: &str) -> Self {
        Self {
            lock_fence: format!(
                "INSERT INTO {s}.fence (scope) VALUES ($1) \
                 ON CONFLICT (scope) DO UPDATE SET scope = EXCLUDED.scope \
                 RETURNING token, lease, txid_current()"
            ),
            // The facts, and the fence advanced to $3 (never lowered) in the same statement:
            // the update touches only the fence row this transaction has locked, the read
            // only `meta` and `keys`, so neither sees the other.
            facts: format!(
                "WITH advance AS (UPDATE {s}.fence SET token = $3, lease = $4 \
                     WHERE scope = $1 AND (token IS NULL OR token < $3)) \
                 SELECT m.watermark, k.key IS NOT NULL, k.result FROM {s}.meta m \
                 LEFT JOIN {s}.keys k ON k.scope = $1 AND k.key = $2"
            ),
            // Record an applied key — only if this is still the transaction that took the
            // fence lock (a closure may have ended it with a COMMIT or ROLLBACK of its own):
            // otherwise a division by zero (SQLSTATE 22012) aborts whatever transaction this
            // is, so the COMMIT sent behind it commits nothing. (txid_current() is stable, not
            // immutable, so the planner never folds the division ahead of time, in generic and
            // custom plans alike.)
            record: format!(
                "INSERT INTO {s}.keys (scope, key, token, result) \
                 SELECT $1, $2, $3, $4 WHERE 1 / (txid_current() = $5)::int = 1 \
                 ON CONFLICT DO NOTHING"
            ),
            collect: format!(
                "WITH raise AS (UPDATE {s}.meta SET watermark = $1 WHERE watermark < $1), \
                 w AS (SELECT GREATEST($1, watermark) AS w FROM {s}.meta), \
                 gone AS (DELETE FROM {s}.fence WHERE scope IN ( \
                     SELECT scope FROM {s}.fence WHERE token < (SELECT w FROM w) \
                     ORDER BY token LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1), \
                 expired AS (DELETE FROM {s}.keys WHERE (scope, key) IN ( \
                     SELECT scope, key FROM {s}.keys \
                     WHERE applied_at < now() - $3 * interval '1 millisecond' \
                     ORDER BY applied_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1) \
                 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM expired)"
            ),
            highest: format!("SELECT token, lease FROM {s}.fence WHERE scope = $1"),
            // Lock every key the mutations touch, in one order (no deadlock between two
            // writers of overlapping keys), creating the missing ones to lock them too.
            lock_data: format!(
                "INSERT INTO {s}.data (key) SELECT k FROM unnest($1::text[]) AS k ORDER BY k \
                 ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING key, value"
            ),
            write_data: format!(
                "UPDATE {s}.data d SET value = x.value \
                 FROM unnest($1::text[], $2::jsonb[]) AS x(key, value) WHERE d.key = x.key"
            ),
            read_data: format!("SELECT value FROM {s}.data WHERE key = $1 AND value IS NOT NULL"),
            push_outbox: format!(
                "INSERT INTO {s}.outbox (target, scope, key, token, payload) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (target, scope, key) DO NOTHING"
            ),
        }
    }
}

/// What steps 1 and 2 read under the fence lock.
struct Facts {
    /// The transaction holding the lock.
    xid: i64,
    highest: Option<Fence>,
    watermark: FencingToken,
    key_applied: bool,
    result: Option<serde_json::Value>,
}

impl PostgresSink {
    /// How often one process publishes a grown watermark and collects, at most.
    pub const DEFAULT_COLLECT_INTERVAL: Duration = Duration::from_millis(100);

    /// Most fence rows (and, separately, expired keys) one collection deletes when collecting
    /// by interval: 10 runs a second keep up with 20,000 writes a second per process.
    const COLLECT_BATCH: usize = 2048;

    /// Connections one sink keeps at most, unless the URL says `pool_size=N`. A fenced
    /// transaction holds its connection for three round trips plus the handler's own
    /// statements, about a millisecond, so 8 connections carry thousands of transactions a
    /// second — more than one database server commits — while every worker process takes
    /// its share of the server's `max_connections` (100 by default, 3 of them reserved):
    /// twelve processes fit. Against a 2-core server, 16 gained a little and 32 nothing
    /// (docs/performance.md, settings the code cites); raise it for handlers that hold
    /// transactions long.
    pub const DEFAULT_POOL_SIZE: usize = 8;

    /// Idempotency keys are kept this long unless configured otherwise.
    pub const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(24 * 3600);

    /// Connects to `url` (`postgres://user@host/db`, optionally `?schema=name`; default schema
    /// `palisade`) and brings the schema to this version (creating it if missing). Fails with
    /// [`Error::Config`] on a bad URL or schema name, [`Error::Unavailable`] if the server
    /// cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_until_ready(url, Duration::ZERO).await
    }

    /// [`connect`](Self::connect), waiting up to `patience` for a server that is there but not
    /// ready — starting up, out of connection slots, or a link that drops or leaves the first
    /// connections unanswered. A refused connection or a wrong setting still fails at once.
    pub async fn connect_until_ready(url: &str, patience: Duration) -> Result<Self> {
        Self::connect_with(url, patience, Migrations::Apply).await
    }

    /// [`connect_until_ready`](Self::connect_until_ready), applying the schema's migrations
    /// or only checking that they were applied ([`Migrations`]).
    pub async fn connect_with(
        url: &str,
        patience: Duration,
        migrations: Migrations,
    ) -> Result<Self> {
        let Extras {
            url,
            schema,
            pool_size,
        } = split_schema(url)?;
        let schema = checked_schema(&schema)?;
        let (pool, protocol) = pool(&url, pool_size)?;
        let sink = Self {
            pool,
            protocol,
            sql: Statements::new(&schema),
            schema,
            retention: Self::DEFAULT_KEY_RETENTION,
            observed: AtomicU64::new(0),
            published: AtomicU64::new(0),
            started: Instant::now(),
            swept_ms: AtomicU64::new(0),
            collect_every: Self::DEFAULT_COLLECT_INTERVAL,
        };
        when_ready(&sink.pool, patience, || async {
            match migrations {
                // (It applies what was pending and refuses a schema it cannot run against.)
                Migrations::Apply => migrate::run(&sink.pool, &sink.schema).await.map(drop),
                Migrations::Check => match migrate::plan(&sink.pool, &sink.schema).await?.refusal()
                {
                    Some(why) => Err(Error::Config(why)),
                    None => Ok(()),
                },
            }
        })
        .await?;
        Ok(sink)
    }

    /// Forgets idempotency keys after `retention` (a repeat of such a write after that
    /// applies again).
    pub fn with_key_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Publishes the watermark and collects at most this often per process (default 100 ms;
    /// zero: at every write call whose watermark grew, as the memory and Redis sinks do).
    /// Publishing takes the sink's one `meta` row lock, which every process would otherwise
    /// queue for after each settle; in between, this process still refuses writes below the
    /// watermark it observed.
    pub fn with_collect_interval(mut self, every: Duration) -> Self {
        self.collect_every = every;
        self
    }

    /// The quoted schema name, for SQL of the caller's own (tests, status).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The connection pool, for the caller's own unfenced reads.
    pub fn pool(&self) -> &deadpool_postgres::Pool {
        &self.pool
    }

    /// Takes note of the coordinator's low watermark; published with the next write.
    pub fn observe_watermark(&self, watermark: FencingToken) {
        self.observed
            .fetch_max(watermark.as_u64(), Ordering::Relaxed);
    }

    /// Which database and schema this is, however it is reached (direct, through a pooler,
    /// by another host name): `postgres:<system identifier>/<database>/<schema>` (the
    /// server's cluster identifier from `pg_control_system()`; database and schema with every
    /// byte but letters, digits, `_`, `-` and `.` written `%XX`, so the identity holds no
    /// space). `None` where the server refuses to say (a role without the right, a service
    /// without the function). Workers compare it to find one sink configured in two places.
    /// A `pg_upgrade` or a restore into a new cluster changes it: a move, as the docs say.
    pub async fn identity(&self) -> Result<Option<String>> {
        let client = self.client().await?;
        // (One statement, no parameters: a text query, fine behind any pooler.)
        let rows = match client
            .simple_query(
                "SELECT (SELECT system_identifier FROM pg_control_system())::text, \
                 current_database()",
            )
            .await
        {
            Ok(rows) => rows,
            // The server answered, and refused: it will not say who it is.
            Err(e) if e.as_db_error().is_some() => return Ok(None),
            Err(e) => return Err(postgres_error(e)),
        };
        let encode = |text: &str| {
            text.bytes()
                .map(|b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                        char::from(b).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        let row = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some((row.get(0)?, row.get(1)?)),
            _ => None,
        });
        Ok(row.map(|(system, database): (&str, &str)| {
            format!(
                "postgres:{}/{}/{}",
                encode(system),
                encode(database),
                encode(&self.schema)
            )
        }))
    }

    /// One round trip (`SELECT 1`), for readiness probes.
    pub async fn ping(&self) -> Result<()> {
        let client = self.client().await?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(postgres_error)?;
        Ok(())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(pool_error)
    }

    /// Publishes the observed watermark if it grew, and forgets at most `budget` fences
    /// below it and `budget` keys past their retention. One autocommit statement.
    async fn collect(&self, client: &deadpool_postgres::Object, budget: usize) -> Result<()> {
        let w = self.observed.load(Ordering::Relaxed);
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.swept_ms.load(Ordering::Relaxed);
        let since = now_ms.saturating_sub(last);
        // Collect when the watermark grew (at most every `collect_every`), and sweep expired
        // keys at least once a second; one caller at a time takes the turn.
        let grew = w > self.published.load(Ordering::Relaxed);
        let due = (grew && since >= self.collect_every.as_millis() as u64) || since >= 1000;
        if !due
            || self
                .swept_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return Ok(());
        }
        // A watermark past BIGINT (no real coordinator reaches it) refuses everything anyway.
        let w_sql = i64::try_from(w).unwrap_or(i64::MAX);
        // Collecting once per interval instead of once per call, it must take more per run
        // to keep up: a few thousand rows, still one short statement.
        let budget = if self.collect_every.is_zero() {
            budget
        } else {
            budget.max(Self::COLLECT_BATCH)
        };
        let budget = i64::try_from(budget).unwrap_or(i64::MAX);
        let retention_ms = sql_millis(self.retention);
        let params: [Param; 3] = [
            (&w_sql, Type::INT8),
            (&budget, Type::INT8),
            (&retention_ms, Type::FLOAT8),
        ];
        match self.protocol {
            Protocol::Cached => {
                let statement = client
                    .prepare_cached(&self.sql.collect)
                    .await
                    .map_err(postgres_error)?;
                client
                    .query_one(&statement, &protocol::values(&params))
                    .await
            }
            Protocol::Unnamed => client.query_typed_one(&self.sql.collect, &params).await,
        }
        .map_err(postgres_error)?;
        self.published.fetch_max(w, Ordering::Relaxed);
        Ok(())
    }

    /// Steps 1 and 2: the fence lock, then the facts — with the fence advanced to `fence`
    /// ahead of the decision — sent together (one round trip). The server runs them in order,
    /// each statement with its own snapshot, so the facts are still read after the lock is
    /// held; the lock's row is returned before the advance touches it. The advance is
    /// what an admitted write does first anyway (strictly by token, never lowering the fence);
    /// a refused one rolls its transaction back, and the advance with it.
    async fn open(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        scope: &str,
        key: &str,
        fence: Fence,
    ) -> Result<Facts> {
        let p = self.protocol;
        let lock = p.prepare(tx, &self.sql.lock_fence).await;
        let facts = p.prepare(tx, &self.sql.facts).await;
        let (lock, facts) = (
            lock.map_err(postgres_error)?,
            facts.map_err(postgres_error)?,
        );
        let token = bigint(fence.token)?;
        let lease = fence.lease.as_uuid();
        let lock_args: [Param; 1] = [(&scope, Type::TEXT)];
        let facts_args: [Param; 4] = [
            (&scope, Type::TEXT),
            (&key, Type::TEXT),
            (&token, Type::INT8),
            (lease, Type::UUID),
        ];
        // try_join polls them in this order, and each sends its request on its first poll.
        let (lock_values, facts_values) =
            (protocol::values(&lock_args), protocol::values(&facts_args));
        let (locked, row) = match (lock, facts) {
            (Some(lock), Some(facts)) => futures_util::try_join!(
                tx.query_one(&lock, &lock_values),
                tx.query_one(&facts, &facts_values),
            ),
            // Behind a transaction pooler the connection carries no session option, so the
            // transaction sets the server's idle timeout itself (SET LOCAL: it ends with the
            // transaction), sent ahead of the lock in the same round trip: a process paused
            // in the closure loses the transaction, and the scope's next holder its wait.
            _ => futures_util::try_join!(
                tx.batch_execute(IDLE_TIMEOUT_LOCAL),
                tx.query_typed_one(&self.sql.lock_fence, &lock_args),
                tx.query_typed_one(&self.sql.facts, &facts_args),
            )
            .map(|(_, locked, row)| (locked, row)),
        }
        .map_err(postgres_error)?;
        let token: Option<i64> = locked.get(0);
        let lease: Option<Uuid> = locked.get(1);
        let xid: i64 = locked.get(2);
        let highest = match (token, lease) {
            (Some(t), Some(l)) => Some(Fence {
                token: FencingToken::from_u64(u64::try_from(t).map_err(|_| {
                    Error::Backend(format!("fence of {scope:?} holds a negative token {t}"))
                })?),
                lease: LeaseId::from(l),
            }),
            _ => None,
        };
        let stored: i64 = row.get(0);
        // The watermark this process observed counts at once, published or not.
        let watermark = u64::try_from(stored)
            .unwrap_or(0)
            .max(self.observed.load(Ordering::Relaxed));
        Ok(Facts {
            xid,
            highest,
            watermark: FencingToken::from_u64(watermark),
            key_applied: row.get(1),
            result: row.get(2),
        })
    }

    /// Records the applied `key` with the write's `result` in the transaction `xid` that
    /// holds the fence lock, and commits, in one round trip; an error if that transaction is
    /// no longer the current one (nothing of it is committed then).
    ///
    /// The COMMIT goes out right behind the record, so it cannot go through
    /// `Transaction::commit` (which takes the transaction the record's future borrows): it is
    /// sent as a COMMIT and a BEGIN, and the transaction guard's ROLLBACK on drop ends that
    /// empty second transaction (a bare ROLLBACK after COMMIT would put a warning in the
    /// server's log for every job). The record fails — division by zero, on purpose — when
    /// the transaction is not the one that took the lock, so a closure that ended it and began
    /// another sees that other one rolled back, not committed.
    async fn record_and_commit(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
        scope: &str,
        key: &str,
        token: FencingToken,
        result: Option<serde_json::Value>,
        xid: i64,
    ) -> Ended {
        let statement = match self.protocol.prepare(&tx, &self.sql.record).await {
            Ok(statement) => statement,
            Err(e) => return Ended::RolledBack(postgres_error(e)),
        };
        let result = result.filter(|v| !v.is_null());
        // Refused here, not by the driver after the COMMIT is queued: a record that cannot
        // be sent must not let the transaction commit without its key.
        let size = result
            .as_ref()
            .map_or(0, |v| serde_json::to_vec(v).map_or(usize::MAX, |b| b.len()));
        if size > MAX_RECORDED_RESULT {
            return Ended::RolledBack(Error::Payload(format!(
                "the transaction's result is {size} bytes; at most {MAX_RECORDED_RESULT} are \
                 recorded with its key"
            )));
        }
        let token = match bigint(token) {
            Ok(token) => token,
            Err(e) => return Ended::RolledBack(e),
        };
        let args: [Param; 5] = [
            (&scope, Type::TEXT),
            (&key, Type::TEXT),
            (&token, Type::INT8),
            (&result, Type::JSONB),
            (&xid, Type::INT8),
        ];
        let record = async {
            match &statement {
                Some(statement) => tx.execute(statement, &protocol::values(&args)).await,
                None => tx.execute_typed(&self.sql.record, &args).await,
            }
        };
        // Three messages, one round trip. BEGIN is its own query, so it runs even after a
        // failed COMMIT (the guard's ROLLBACK then ends it quietly), and its own failure is
        // not taken for the COMMIT's.
        let (recorded, committed, _) = futures_util::join!(
            record,
            tx.batch_execute("COMMIT"),
            tx.batch_execute("BEGIN"),
        );
        drop(tx);
        match recorded {
            // The server answered: the transaction is aborted, and the COMMIT behind the
            // record rolled it back.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO) => {
                return Ended::RolledBack(ended_inside(key))
            }
            Err(e) if e.as_db_error().is_some() => return Ended::RolledBack(postgres_error(e)),
            // The link failed with the COMMIT already sent: it may have been applied.
            Err(e) => return Ended::Failed(commit_error(e)),
            Ok(1) => {}
            // Committed, under the fence, but nothing recorded: the key was there already,
            // which only a closure writing our own key table can do.
            Ok(_) => {
                return Ended::Failed(Error::Backend(format!(
                    "the fenced transaction for key {key:?} committed, but its key was already \
                     recorded inside it (does the closure write the sink's own key table?)"
                )))
            }
        }
        match committed {
            Ok(()) => Ended::Committed,
            Err(e) => match commit_error(e) {
                e @ Error::OutcomeUnknown(_) => Ended::Failed(e),
                e => Ended::RolledBack(e),
            },
        }
    }

    /// What the caller of [`record_and_commit`](Self::record_and_commit) sees. A write the
    /// server rolled back at its last step (a deferred constraint at COMMIT, a closure that
    /// returned Ok from an aborted transaction, or ended it) passed the ownership checks, so
    /// its token still fences older leases out (step 5, best-effort); the error is returned
    /// either way.
    async fn settle_ended(
        &self,
        client: &mut deadpool_postgres::Object,
        scope: &str,
        fence: Fence,
        ended: Ended,
    ) -> Result<()> {
        match ended {
            Ended::Committed => Ok(()),
            Ended::Failed(e) => Err(e),
            Ended::RolledBack(e) => {
                self.fence_anyway(client, scope, fence).await;
                Err(e)
            }
        }
    }

    /// Step 5, best-effort, for a write rolled back after it passed the ownership checks:
    /// the caller reports the write's own error whether or not the fence could be advanced.
    async fn fence_anyway(
        &self,
        client: &mut deadpool_postgres::Object,
        scope: &str,
        fence: Fence,
    ) {
        if let Err(advance) = self.advance_after_refusal(client, scope, fence).await {
            cannot_fence(scope, &advance);
        }
    }

    /// Whether `tx` is still the transaction `xid` that took the fence lock (a closure may
    /// have ended it with a COMMIT or ROLLBACK of its own). A failed query counts as open: the
    /// rollback that follows then decides.
    async fn still_open(&self, tx: &deadpool_postgres::Transaction<'_>, xid: i64) -> bool {
        match tx.query_typed_one("SELECT txid_current()", &[]).await {
            Ok(row) => row.get::<_, i64>(0) == xid,
            Err(_) => true,
        }
    }

    /// Step 5: after a write under `fence` was refused for its content and rolled back, a
    /// second transaction advances the scope's fence to it if the write still passes the
    /// ownership checks (strictly by token; no key recorded, no data changed).
    async fn advance_after_refusal(
        &self,
        client: &mut deadpool_postgres::Object,
        scope: &str,
        fence: Fence,
    ) -> Result<()> {
        let tx = begin(client).await?;
        // No key to look up: a content refusal records none, and the decision below only
        // asks whether the write still owns the scope.
        let facts = self.open(&tx, scope, "", fence).await?;
        match admission::decide(facts.highest, fence, false, facts.watermark) {
            Admission::Rejected(_) => tx.rollback().await.map_err(postgres_error),
            _ => Self::commit(tx).await,
        }
    }

    /// Commits; a lost answer to COMMIT is [`Error::OutcomeUnknown`].
    async fn commit(tx: deadpool_postgres::Transaction<'_>) -> Result<()> {
        tx.commit().await.map_err(commit_error)
    }

    /// Runs `f` in one fenced transaction for `scope` under `fence`, keyed by `key`:
    /// refused → `f` never runs, nothing changes; key applied before → `f` never runs, the
    /// recorded result comes back; otherwise `f` runs on the transaction and its result is
    /// recorded with the key in the same commit. An error from `f` rolls everything back:
    /// a `tokio_postgres::Error` or a palisade [`Error`] keeps its class (a serialization
    /// failure is retryable), any other error is [`Error::Aborted`].
    pub async fn transaction<R, F>(
        &self,
        scope: &Scope,
        fence: Fence,
        key: &IdempotencyKey,
        f: F,
    ) -> Result<Fenced<R>>
    where
        R: Serialize + DeserializeOwned + Send,
        F: TransactionFn<R>,
    {
        let me = self as *const Self as usize;
        if inside_transaction_of(self) {
            // The outer transaction holds the fence lock this one would wait for, forever.
            return Err(Error::InvalidJob(
                "a fenced transaction cannot start another on the same Postgres sink from \
                 inside its closure; write through the closure's `tx` instead"
                    .into(),
            ));
        }
        bigint(fence.token)?;
        let mut client = self.client().await?;
        let result = self
            .transaction_on(&mut client, me, scope, fence, key, f)
            .await;
        discard_if_broken(client, &result);
        result
    }

    async fn transaction_on<R, F>(
        &self,
        client: &mut deadpool_postgres::Object,
        me: usize,
        scope: &Scope,
        fence: Fence,
        key: &IdempotencyKey,
        f: F,
    ) -> Result<Fenced<R>>
    where
        R: Serialize + DeserializeOwned + Send,
        F: TransactionFn<R>,
    {
        self.collect(client, crate::store::collect_budget(1))
            .await?;
        let tx = begin(client).await?;
        let facts = self.open(&tx, scope.as_str(), key.as_str(), fence).await?;
        match admission::decide(facts.highest, fence, facts.key_applied, facts.watermark) {
            Admission::Rejected(rejection) => {
                tx.rollback().await.map_err(postgres_error)?;
                Ok(Fenced::Rejected(rejection))
            }
            Admission::Duplicate => {
                let result =
                    serde_json::from_value(facts.result.unwrap_or_default()).map_err(|e| {
                        Error::Payload(format!(
                            "the result recorded for key {key} does not decode: {e}"
                        ))
                    })?;
                Self::commit(tx).await?;
                Ok(Fenced::Duplicate(result))
            }
            Admission::Applied => {
                // The closure borrows the transaction only inside this block, so that after a
                // failure this connection is free for step 5 (a second pooled connection per
                // failing closure could wait out the pool when every connection fails at once).
                let (tx, outcome) = {
                    let fenced = FencedTx {
                        tx,
                        sink: self,
                        scope: scope.clone(),
                        token: fence.token,
                        key: key.as_str().to_owned(),
                    };
                    let outcome = IN_FENCED_TX.scope(me, f(&fenced)).await;
                    (fenced.tx, outcome)
                };
                let value = match outcome {
                    Ok(value) => value,
                    Err(e) => {
                        // A closure that ended the transaction itself and then failed: what it
                        // committed stays, uncovered by the fence — said, as on success.
                        if !self.still_open(&tx, facts.xid).await {
                            let _ = tx.rollback().await;
                            return Err(ended_inside(key.as_str()));
                        }
                        // Best-effort (step 5): the closure's error is what the caller must
                        // see, whether or not the fence could be advanced.
                        match tx.rollback().await {
                            Ok(()) => self.fence_anyway(client, scope.as_str(), fence).await,
                            Err(rollback) => {
                                cannot_fence(scope.as_str(), &postgres_error(rollback))
                            }
                        }
                        return Err(closure_error(e));
                    }
                };
                let json = serde_json::to_value(&value)
                    .map_err(|e| Error::Payload(format!("transaction result: {e}")))?;
                let ended = self
                    .record_and_commit(
                        tx,
                        scope.as_str(),
                        key.as_str(),
                        fence.token,
                        Some(json),
                        facts.xid,
                    )
                    .await;
                self.settle_ended(client, scope.as_str(), fence, ended)
                    .await?;
                Ok(Fenced::Applied(value))
            }
        }
    }

    /// The newest generation accepted for `scope`.
    pub async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        let client = self.client().await?;
        let row = client
            .query_typed_opt(&self.sql.highest, &[(&scope.as_str(), Type::TEXT)])
            .await
            .map_err(postgres_error)?;
        Ok(row.and_then(|row| {
            let token: Option<i64> = row.get(0);
            let lease: Option<Uuid> = row.get(1);
            Some(Fence {
                token: FencingToken::from_u64(u64::try_from(token?).ok()?),
                lease: LeaseId::from(lease?),
            })
        }))
    }
}

/// How [`PostgresSink::record_and_commit`] ended.
enum Ended {
    Committed,
    /// Nothing of the transaction committed; the server refused it after the ownership
    /// checks passed (or the closure had ended it), so its fence must still be advanced.
    RolledBack(Error),
    /// Committed or not, nothing more to do than report it (a lost answer is
    /// [`Error::OutcomeUnknown`]).
    Failed(Error),
}

/// Most bytes of a closure's result recorded with its key (jsonb holds at most 256 MiB).
const MAX_RECORDED_RESULT: usize = 255 << 20;

/// A refused write's fence could not be advanced (step 5 is best-effort).
fn cannot_fence(scope: &str, error: &Error) {
    tracing::warn!(scope, %error, "a refused fenced transaction could not advance its fence");
}

/// What a failed COMMIT means. An error about the transaction itself (a deferred constraint,
/// a serialization failure) means it rolled back. The connection going away — dropped, or
/// the server process terminated or shutting down (08, 57P) — says nothing about whether the
/// commit record was written first: [`Error::OutcomeUnknown`].
fn commit_error(e: tokio_postgres::Error) -> Error {
    let connection_lost = e.as_db_error().is_none_or(|db| {
        ["08", "57P"]
            .iter()
            .any(|c| db.code().code().starts_with(c))
    });
    if connection_lost {
        Error::OutcomeUnknown(format!("postgres COMMIT: {}", postgres_error(e)))
    } else {
        postgres_error(e)
    }
}

/// A fenced transaction's closure ended the transaction itself: what it committed is not
/// covered by the fence, and no key was recorded for it.
fn ended_inside(key: &str) -> Error {
    Error::Backend(format!(
        "the fenced transaction for key {key:?} was ended inside its closure (a COMMIT or \
         ROLLBACK in its SQL?); its changes are not covered by the fence"
    ))
}

tokio::task_local! {
    /// The sink whose fenced transaction the current task's closure runs in (its address):
    /// a nested fenced write to the same sink would wait for the outer transaction's lock.
    static IN_FENCED_TX: usize;
}

/// Whether the current task is inside a fenced transaction's closure on `sink`.
#[doc(hidden)]
pub fn inside_transaction_of(sink: &PostgresSink) -> bool {
    let me = sink as *const PostgresSink as usize;
    IN_FENCED_TX.try_with(|outer| *outer == me).unwrap_or(false)
}

/// Keeps a connection that failed with a transient error out of the pool: it may be closing
/// (a terminated backend), and the pool's quick check could hand it to the retry before it
/// notices.
pub(crate) fn discard_if_broken<T>(client: deadpool_postgres::Object, result: &Result<T>) {
    if result.as_ref().is_err_and(Error::is_retryable) {
        drop(deadpool_postgres::Object::take(client));
    }
}

/// Starts a transaction at READ COMMITTED whatever the server's default: the fence protocol
/// relies on each statement seeing what was committed before it (see the module docs);
/// under REPEATABLE READ step 2 would read a snapshot from before the lock wait.
pub(crate) async fn begin(
    client: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(postgres_error)
}

/// What a closure's error means for the caller: a database error keeps its class, as does
/// one of ours (from [`OutboxWriter::push`]); anything else is the closure's own decision.
fn closure_error(e: BoxError) -> Error {
    match e.downcast::<tokio_postgres::Error>() {
        Ok(pg) => postgres_error(*pg),
        Err(e) => match e.downcast::<Error>() {
            Ok(ours) => *ours,
            Err(other) => Error::Aborted(other.to_string()),
        },
    }
}

/// The transaction a fenced closure runs on: everything of
/// [`deadpool_postgres::Transaction`] (through `Deref`: `execute`, `query`,
/// `query_typed`, …) plus [`FencedTx::outbox`], which records an effect in the same
/// transaction. Behind a pooler in transaction mode (`pooler=transaction`), `query` and
/// `execute` with SQL text work (the statement is prepared, run and closed inside the
/// transaction; columns of types the driver does not know, such as your enums, are not
/// covered: their type lookups are cached past the transaction) and
/// `query_typed`/`execute_typed` save a round trip; `prepare_cached` does not (its statement
/// outlives the transaction, on a server connection the pooler gives to others).
pub struct FencedTx<'t> {
    tx: deadpool_postgres::Transaction<'t>,
    sink: &'t PostgresSink,
    scope: Scope,
    token: FencingToken,
    /// The transaction's idempotency key, which prefixes its outbox keys so a re-run of the
    /// job pushes under the same keys.
    key: String,
}

impl<'t> std::ops::Deref for FencedTx<'t> {
    type Target = deadpool_postgres::Transaction<'t>;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl FencedTx<'_> {
    /// The outbox of `target` ("email"), written in this transaction: an effect recorded
    /// here exists iff the transaction commits, so a stale generation cannot record one.
    pub fn outbox(&self, target: &str) -> OutboxWriter<'_> {
        OutboxWriter::new(self, target)
    }

    /// The scope this transaction is fenced on.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The sink's schema, quoted for SQL (`"palisade"`, or what the sink URL's `?schema=`
    /// names): for a handler whose own tables live beside the sink's, so its SQL can name
    /// them (`format!("UPDATE {}.invoice ...", tx.schema())`) without a `search_path` of its own.
    pub fn schema(&self) -> &str {
        self.sink.schema()
    }
}

/// Shared with [`PostgresFencedStore`]: one `Mutation` write as a fenced transaction.
pub(crate) async fn write_mutations(
    sink: &PostgresSink,
    client: &mut deadpool_postgres::Object,
    write: crate::store::FencedWrite,
) -> Result<Admission> {
    let tx = begin(client).await?;
    let scope = write.scope.as_str();
    let key = write.key.as_str();
    bigint(write.fence.token)?;
    let facts = sink.open(&tx, scope, key, write.fence).await?;
    let decided = admission::decide(
        facts.highest,
        write.fence,
        facts.key_applied,
        facts.watermark,
    );
    match decided {
        Admission::Rejected(_) => {
            tx.rollback().await.map_err(postgres_error)?;
            return Ok(decided);
        }
        Admission::Duplicate => {}
        Admission::Applied => {
            if let Err(why) = fenced::apply(sink, &tx, write.mutations).await? {
                tx.rollback().await.map_err(postgres_error)?;
                sink.advance_after_refusal(client, scope, write.fence)
                    .await?;
                return Ok(Admission::Rejected(Rejection::Mutation { why }));
            }
            let ended = sink
                .record_and_commit(tx, scope, key, write.fence.token, None, facts.xid)
                .await;
            sink.settle_ended(client, scope, write.fence, ended).await?;
            return Ok(decided);
        }
    }
    PostgresSink::commit(tx).await?;
    Ok(decided)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 56: the errors PgBouncer 1.18 in transaction mode gave a shop crate's jobs (100
    /// dead-lettered as "backend error") are the pooler's, retried; the same codes for other
    /// reasons are not.
    #[test]
    fn a_transaction_pooler_s_errors_are_retried_and_named() {
        for (code, message) in [
            ("26000", "prepared statement \"s12\" does not exist"),
            ("42P05", "prepared statement \"s3\" already exists"),
            (
                "08P01",
                "bind message supplies 2 parameters, but prepared statement \"s116\" requires 1",
            ),
        ] {
            assert!(pooler_sqlstate(code, message), "{code}");
        }
        assert!(!pooler_sqlstate("26000", "invalid statement name"));
        // A user's own statements, and the unnamed one, are the user's errors.
        assert!(!pooler_sqlstate(
            "26000",
            "prepared statement \"my_stmt\" does not exist"
        ));
        assert!(!pooler_sqlstate(
            "42P05",
            "prepared statement \"p\" already exists"
        ));
        assert!(!pooler_sqlstate(
            "08P01",
            "bind message supplies 1 parameters, but prepared statement \"\" requires 2"
        ));
        assert!(!pooler_sqlstate(
            "26000",
            "prepared statement \"s\" does not exist"
        ));
        assert!(!pooler_sqlstate("42P01", "relation \"x\" does not exist"));
        assert!(POOLER_HINT.contains("Behind a pooler"));
    }

    #[test]
    fn the_pooler_parameter_is_taken_out_of_the_url() {
        let (url, protocol) =
            split_pooler("postgres://u@h/db?sslmode=disable&pooler=transaction&x=1").unwrap();
        assert_eq!(
            (url.as_str(), protocol),
            ("postgres://u@h/db?sslmode=disable&x=1", Protocol::Unnamed)
        );
        let (url, protocol) = split_pooler("postgres://u@h/db?pooler=session").unwrap();
        assert_eq!(
            (url.as_str(), protocol),
            ("postgres://u@h/db", Protocol::Cached)
        );
        let (_, protocol) = split_pooler("postgres://u@h/db").unwrap();
        assert_eq!(protocol, Protocol::Cached);
        assert!(matches!(
            split_pooler("postgres://u@h/db?pooler=true"),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn sqlstates_are_classified_by_what_to_do() {
        for transient in [
            "08006", "40001", "40P01", "53300", "57P01", "57014", "55P03", "25006",
        ] {
            assert!(transient_sqlstate(transient), "{transient}");
        }
        for permanent in ["42P01", "23505", "22021", "42601", "25P02"] {
            assert!(!transient_sqlstate(permanent), "{permanent}");
        }
    }

    #[test]
    fn schema_and_pool_size_come_out_of_the_url_and_are_checked() {
        let extras =
            split_schema("postgres://u@h/db?schema=orders_x&sslmode=disable&pool_size=3").unwrap();
        assert_eq!(extras.url, "postgres://u@h/db?sslmode=disable");
        assert_eq!(extras.schema, "orders_x");
        assert_eq!(extras.pool_size, 3);
        let plain = split_schema("postgres://u@h/db").unwrap();
        assert_eq!(plain.schema, "palisade");
        assert_eq!(plain.pool_size, PostgresSink::DEFAULT_POOL_SIZE);
        for bad in ["0", "-1", "1001", "x", ""] {
            let url = format!("postgres://u@h/db?pool_size={bad}");
            assert!(
                matches!(split_schema(&url), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
        assert_eq!(checked_schema("orders_x").unwrap(), "\"orders_x\"");
        for bad in ["", "1abc", "Orders", "a;drop", "a\"b", &"x".repeat(64)] {
            assert!(checked_schema(bad).is_err(), "{bad:?}");
        }
    }
}
