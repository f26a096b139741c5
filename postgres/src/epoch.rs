//! [`PostgresEpochSource`]: the coordinator's epoch kept in a Postgres row.

use async_trait::async_trait;
use tokio_postgres::types::Type;

use crate::postgres_error;
use palisade_core::error::{Error, Result};
use palisade_core::ids::FencingToken;
use palisade_core::store::epoch::EpochSource;

/// A row in Postgres, for coordinators whose workers run on many hosts: every bump is one
/// committed `INSERT .. ON CONFLICT DO UPDATE .. RETURNING`, atomic under the row lock, so
/// concurrent workers on different hosts never receive the same epoch.
#[derive(Clone)]
pub struct PostgresEpochSource {
    pool: deadpool_postgres::Pool,
    name: String,
}

impl PostgresEpochSource {
    /// Epochs for the coordinator called `name` (use its key prefix), in table
    /// `palisade_epochs` of the database at `url` (created if missing).
    pub async fn connect(url: &str, name: &str) -> Result<Self> {
        Self::connect_until_ready(url, name, std::time::Duration::ZERO).await
    }

    /// [`connect`](Self::connect), waiting up to `patience` for a server that is there but not
    /// ready (as [`PostgresSink::connect_until_ready`](crate::PostgresSink::connect_until_ready)
    /// does).
    pub async fn connect_until_ready(
        url: &str,
        name: &str,
        patience: std::time::Duration,
    ) -> Result<Self> {
        // (Its statements go out unnamed whatever the URL's `pooler` says.)
        let (pool, _) = crate::pool(url, 2)?;
        let source = Self {
            pool,
            name: name.to_owned(),
        };
        crate::when_ready(&source.pool, patience, || source.create_table()).await?;
        Ok(source)
    }

    async fn create_table(&self) -> Result<()> {
        let mut client = self.client().await?;
        // A transaction of the driver's, not a BEGIN in a batch: one that fails is rolled back
        // when dropped, so a retry does not meet its session still in an aborted transaction.
        let tx = client.transaction().await.map_err(postgres_error)?;
        // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog; an advisory
        // lock makes first start-up on many hosts at once safe.
        tx.batch_execute(
            "SELECT pg_advisory_xact_lock(7461827);
             CREATE TABLE IF NOT EXISTS palisade_epochs (
                 name  TEXT PRIMARY KEY,
                 epoch BIGINT NOT NULL CHECK (epoch > 0)
             );",
        )
        .await
        .map_err(postgres_error)?;
        tx.commit().await.map_err(postgres_error)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(crate::pool_error)
    }
}

#[async_trait]
impl EpochSource for PostgresEpochSource {
    async fn next_epoch(&self, at_least: u32) -> Result<u32> {
        let row = self
            .client()
            .await?
            .query_typed_one(
                "INSERT INTO palisade_epochs (name, epoch) VALUES ($1, GREATEST(1, $2::BIGINT))
                 ON CONFLICT (name) DO UPDATE
                     SET epoch = GREATEST(palisade_epochs.epoch + 1, EXCLUDED.epoch)
                 RETURNING epoch",
                &[(&self.name, Type::TEXT), (&i64::from(at_least), Type::INT8)],
            )
            .await
            .map_err(postgres_error)?;
        let epoch: i64 = row.get(0);
        u32::try_from(epoch)
            .ok()
            .filter(|e| *e <= FencingToken::MAX_EPOCH)
            .ok_or_else(|| {
                Error::Epoch(format!(
                    "postgres row {:?} holds epoch {epoch}, above the largest ({})",
                    self.name,
                    FencingToken::MAX_EPOCH
                ))
            })
    }
}
