//! Embedded, versioned migrations of a fenced sink's schema: applied in order, each once, in
//! one transaction under an advisory lock, so many workers starting at once on many hosts
//! agree on one schema version (concurrent `CREATE .. IF NOT EXISTS` can still collide in the
//! catalog; the lock makes them take turns).

use crate::error::{Error, Result};

use super::{pool_error, postgres_error};

/// `(version, SQL)`; `{schema}` stands for the quoted schema name. Append, never edit.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../sql/001_fence.sql")),
    (2, include_str!("../sql/002_outbox_prune.sql")),
];

/// Brings `schema` (quoted) to the newest version this build knows.
pub(super) async fn run(pool: &deadpool_postgres::Pool, schema: &str) -> Result<()> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = super::begin(&mut client).await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[&format!("palisade migrations {schema}")],
    )
    .await
    .map_err(postgres_error)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.migrations (
             version int PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await
    .map_err(postgres_error)?;
    let current: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {schema}.migrations"),
            &[],
        )
        .await
        .map_err(postgres_error)?
        .get(0);
    let newest = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if current > newest {
        return Err(Error::Config(format!(
            "Postgres schema {schema} is at version {current}, newer than this build knows \
             ({newest}); upgrade the worker binary"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(&sql.replace("{schema}", schema))
            .await
            .map_err(postgres_error)?;
        tx.execute(
            &format!("INSERT INTO {schema}.migrations (version) VALUES ($1)"),
            &[version],
        )
        .await
        .map_err(postgres_error)?;
        tracing::info!(schema, version, "applied Postgres sink migration");
    }
    tx.commit().await.map_err(postgres_error)
}
