//! [`PostgresFencedStore`]: the [`FencedStore`] contract over a key/value table, so the
//! conformance suite and the differential test run on Postgres too, and `Mutation` writes
//! (`ctx.sink(..)`) share fences with the transactions of `ctx.postgres(..)`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::types::Type;

use crate::admission::{Admission, Fence};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, Scope};
use crate::mutation::{apply_all, Mutation, Value};
use crate::store::{collect_budget, FencedStore, FencedWrite};

use super::{postgres_error, write_mutations, PostgresSink};

/// A [`FencedStore`] in a Postgres schema (see [`PostgresSink`]); values live in its `data`
/// table as JSON.
#[derive(Clone)]
pub struct PostgresFencedStore {
    sink: Arc<PostgresSink>,
}

impl PostgresFencedStore {
    /// A store over `sink`'s schema.
    pub fn new(sink: Arc<PostgresSink>) -> Self {
        Self { sink }
    }

    /// Connects (see [`PostgresSink::connect`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Ok(Self::new(Arc::new(PostgresSink::connect(url).await?)))
    }

    /// The sink underneath, for fenced transactions over the same fences.
    pub fn sink(&self) -> &Arc<PostgresSink> {
        &self.sink
    }
}

/// Locks the keys `mutations` touch and applies them whole with the shared rule
/// ([`apply_all`]); the inner `Err` is a refusal (nothing written; the caller rolls back).
pub(super) async fn apply(
    sink: &PostgresSink,
    tx: &deadpool_postgres::Transaction<'_>,
    mutations: Vec<Mutation>,
) -> Result<Result<(), String>> {
    if mutations.is_empty() {
        return Ok(Ok(()));
    }
    let mut keys: Vec<String> = mutations.iter().map(|m| m.key().to_owned()).collect();
    keys.sort_unstable();
    keys.dedup();
    let locked = sink
        .protocol
        .query(tx, &sink.sql.lock_data, &[(&keys, Type::TEXT_ARRAY)])
        .await
        .map_err(postgres_error)?;
    let mut data = HashMap::new();
    for row in locked {
        let key: String = row.get(0);
        if let Some(json) = row.get::<_, Option<serde_json::Value>>(1) {
            let value: Value = serde_json::from_value(json).map_err(|e| {
                Error::Backend(format!("data row {key:?} does not hold a Value: {e}"))
            })?;
            data.insert(key, value);
        }
    }
    if let Err(why) = apply_all(&mut data, mutations) {
        return Ok(Err(why));
    }
    // (A deleted key's row keeps a NULL value: absent, as a row locked and never written.)
    let values = keys
        .iter()
        .map(|k| {
            data.get(k)
                .map(|v| serde_json::to_value(v).expect("a Value is JSON"))
        })
        .collect::<Vec<_>>();
    let params: [crate::Param; 2] = [(&keys, Type::TEXT_ARRAY), (&values, Type::JSONB_ARRAY)];
    sink.protocol
        .execute(tx, &sink.sql.write_data, &params)
        .await
        .map_err(postgres_error)?;
    Ok(Ok(()))
}

#[async_trait]
impl FencedStore for PostgresFencedStore {
    async fn write(&self, write: FencedWrite) -> Result<Admission> {
        let mut out = self.write_batch(vec![write]).await?;
        out.pop().expect("one write, one answer")
    }

    /// Each write is its own transaction, in order, on one connection: a refused or failed
    /// write affects only itself.
    async fn write_batch(&self, writes: Vec<FencedWrite>) -> Result<Vec<Result<Admission>>> {
        let mut client = self.sink.client().await?;
        self.sink
            .collect(&client, collect_budget(writes.len()))
            .await?;
        let mut results = Vec::with_capacity(writes.len());
        let mut broken = Ok(());
        for write in writes {
            let result = write_mutations(&self.sink, &mut client, write).await;
            if let Err(e) = &result {
                if e.is_retryable() {
                    broken = Err(Error::Unavailable(e.to_string()));
                }
            }
            results.push(result);
        }
        super::discard_if_broken(client, &broken);
        Ok(results)
    }

    fn observe_watermark(&self, watermark: FencingToken) {
        self.sink.observe_watermark(watermark);
    }

    async fn read(&self, key: &str) -> Result<Option<Value>> {
        let client = self.sink.client().await?;
        let row = client
            .query_typed_opt(&self.sink.sql.read_data, &[(&key, Type::TEXT)])
            .await
            .map_err(postgres_error)?;
        row.map(|row| {
            serde_json::from_value(row.get(0))
                .map_err(|e| Error::Backend(format!("data row {key:?} does not decode: {e}")))
        })
        .transpose()
    }

    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        self.sink.highest(scope).await
    }
}
