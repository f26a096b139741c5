//! The fenced outbox in Postgres: effects recorded inside fenced transactions
//! ([`OutboxWriter`]), and the row operations an `OutboxRelay` uses to
//! deliver them at least once.
//!
//! A relay leases the entries it delivers (`lease`, `leased_until`), so several relays never
//! deliver one entry at the same time, and a relay that crashed leaves its entries to be
//! taken again once the lease runs out. The lease is a row lease rather than the
//! coordinator's, because the entries live in this database, not in the coordinator's Redis:
//! claiming and marking an entry is then one statement each, in the same database.

use std::time::Duration;

use tokio_postgres::types::Type;

use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};

use super::{bigint, pool_error, postgres_error, FencedTx, PostgresSink};

/// Records effects for one target in a fenced transaction.
pub struct OutboxWriter<'a> {
    tx: &'a FencedTx<'a>,
    target: String,
}

impl<'a> OutboxWriter<'a> {
    pub(super) fn new(tx: &'a FencedTx<'a>, target: &str) -> Self {
        Self {
            tx,
            target: target.to_owned(),
        }
    }

    /// Records `payload` for delivery to this target under `key`, which names the effect
    /// within the transaction's own idempotency key: the receiver gets `Idempotency-Key:
    /// <scope>/<transaction key>/<key>`, the same for every run of the job, so it can drop a
    /// repeat. A second push of the same key in one transaction is ignored.
    pub async fn push(&self, key: &str, payload: &impl Serialize) -> Result<()> {
        super::check_key_part("outbox target", &self.target)?;
        super::check_key_part("outbox key", key)?;
        let payload = serde_json::to_value(payload)
            .map_err(|e| Error::Payload(format!("outbox payload: {e}")))?;
        let key = format!("{}/{key}", self.tx.key);
        let token = bigint(self.tx.token)?;
        let params: [crate::Param; 5] = [
            (&self.target, Type::TEXT),
            (&self.tx.scope.as_str(), Type::TEXT),
            (&key, Type::TEXT),
            (&token, Type::INT8),
            (&payload, Type::JSONB),
        ];
        let sink = &self.tx.sink;
        sink.protocol
            .execute(self.tx, &sink.sql.push_outbox, &params)
            .await
            .map_err(postgres_error)?;
        Ok(())
    }
}

/// One outbox entry leased for delivery.
#[derive(Clone, Debug, PartialEq)]
#[doc(hidden)]
pub struct OutboxEntry {
    /// Row id.
    pub id: i64,
    /// Where it goes ("email").
    pub target: String,
    /// Scope of the transaction that recorded it.
    pub scope: String,
    /// Its key (transaction key / push key).
    pub key: String,
    /// What to deliver.
    pub payload: serde_json::Value,
    /// Delivery attempts so far, this one included.
    pub attempts: i32,
    /// The relay's lease on it.
    pub lease: Uuid,
}

impl OutboxEntry {
    /// `<scope>/<key>`: the same for every delivery attempt and every run of the job.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}", self.scope, self.key)
    }
}

/// Counts of outbox entries by state, for status and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    /// Waiting for (another) delivery attempt.
    pub pending: u64,
    /// Delivered.
    pub delivered: u64,
    /// Given up on.
    pub dead: u64,
}

impl PostgresSink {
    /// Leases up to `n` due pending entries for the given targets for `ttl`, oldest first,
    /// skipping entries another relay holds. Counts the attempt.
    #[doc(hidden)]
    pub async fn claim_outbox(
        &self,
        targets: &[String],
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<OutboxEntry>> {
        let s = &self.schema;
        let client = self.client().await?;
        let lease = Uuid::new_v4();
        let rows = client
            .query_typed(
                &format!(
                    "UPDATE {s}.outbox o SET lease = $1, attempts = o.attempts + 1, \
                         leased_until = now() + $2 * interval '1 millisecond' \
                     WHERE o.id IN (SELECT id FROM {s}.outbox \
                         WHERE state = 'pending' AND next_attempt_at <= now() \
                           AND (leased_until IS NULL OR leased_until < now()) \
                           AND target = ANY($3) \
                         ORDER BY next_attempt_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) \
                     RETURNING o.id, o.target, o.scope, o.key, o.payload, o.attempts"
                ),
                &[
                    (&lease, Type::UUID),
                    (&super::sql_millis(ttl), Type::FLOAT8),
                    (&targets, Type::TEXT_ARRAY),
                    (&i64::try_from(n).unwrap_or(i64::MAX), Type::INT8),
                ],
            )
            .await
            .map_err(postgres_error)?;
        let mut entries: Vec<OutboxEntry> = rows
            .into_iter()
            .map(|row| OutboxEntry {
                id: row.get(0),
                target: row.get(1),
                scope: row.get(2),
                key: row.get(3),
                payload: row.get(4),
                attempts: row.get(5),
                lease,
            })
            .collect();
        entries.sort_by_key(|e| e.id);
        Ok(entries)
    }

    /// Marks a leased entry delivered; `false` if the lease was lost meanwhile (another relay
    /// may deliver it again: at least once).
    #[doc(hidden)]
    pub async fn outbox_delivered(&self, entry: &OutboxEntry) -> Result<bool> {
        let s = &self.schema;
        let client = self.client().await?;
        let n = client
            .execute_typed(
                &format!(
                    "UPDATE {s}.outbox SET state = 'delivered', delivered_at = now(), \
                         leased_until = NULL, last_error = NULL \
                     WHERE id = $1 AND lease = $2 AND state = 'pending'"
                ),
                &[(&entry.id, Type::INT8), (&entry.lease, Type::UUID)],
            )
            .await
            .map_err(postgres_error)?;
        Ok(n == 1)
    }

    /// Records a failed attempt: tried again after `retry_in`, or dead (`None`) with `error`.
    #[doc(hidden)]
    pub async fn outbox_failed(
        &self,
        entry: &OutboxEntry,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<bool> {
        let s = &self.schema;
        let client = self.client().await?;
        let retry_ms = retry_in.map(super::sql_millis);
        let n = client
            .execute_typed(
                &format!(
                    "UPDATE {s}.outbox SET last_error = $3, leased_until = NULL, \
                         state = CASE WHEN $4::float8 IS NULL THEN 'dead' ELSE state END, \
                         next_attempt_at = CASE WHEN $4::float8 IS NULL THEN next_attempt_at \
                             ELSE now() + $4::float8 * interval '1 millisecond' END \
                     WHERE id = $1 AND lease = $2 AND state = 'pending'"
                ),
                &[
                    (&entry.id, Type::INT8),
                    (&entry.lease, Type::UUID),
                    (&error, Type::TEXT),
                    (&retry_ms, Type::FLOAT8),
                ],
            )
            .await
            .map_err(postgres_error)?;
        Ok(n == 1)
    }

    /// Dead entries, oldest first, at most `limit`: (id, target, idempotency key, attempts,
    /// last error).
    pub async fn outbox_dead(
        &self,
        limit: usize,
    ) -> Result<Vec<(i64, String, String, i32, String)>> {
        let s = &self.schema;
        let client = self.client().await?;
        let rows = client
            .query_typed(
                &format!(
                    "SELECT id, target, scope || '/' || key, attempts, coalesce(last_error, '') \
                     FROM {s}.outbox WHERE state = 'dead' ORDER BY id LIMIT $1"
                ),
                &[(&i64::try_from(limit).unwrap_or(i64::MAX), Type::INT8)],
            )
            .await
            .map_err(postgres_error)?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect())
    }

    /// Gives up to `limit` dead entries, oldest first, a fresh set of attempts: pending and
    /// due now. Returns how many.
    pub async fn outbox_retry_dead(&self, limit: usize) -> Result<u64> {
        let s = &self.schema;
        let client = self.client().await?;
        client
            .execute_typed(
                &format!(
                    "UPDATE {s}.outbox SET state = 'pending', attempts = 0, \
                         next_attempt_at = now(), leased_until = NULL \
                     WHERE id IN (SELECT id FROM {s}.outbox WHERE state = 'dead' \
                         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)"
                ),
                &[(&i64::try_from(limit).unwrap_or(i64::MAX), Type::INT8)],
            )
            .await
            .map_err(postgres_error)
    }

    /// Deletes up to `limit` entries delivered more than `retention` ago, oldest first;
    /// returns how many. Keeps the outbox bounded by what is pending, dead or recent.
    #[doc(hidden)]
    pub async fn prune_outbox(&self, retention: Duration, limit: usize) -> Result<u64> {
        let s = &self.schema;
        let client = self.client().await?;
        client
            .execute_typed(
                &format!(
                    "DELETE FROM {s}.outbox WHERE id IN (SELECT id FROM {s}.outbox \
                     WHERE state = 'delivered' \
                       AND delivered_at < now() - $1 * interval '1 millisecond' \
                     ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
                ),
                &[
                    (&super::sql_millis(retention), Type::FLOAT8),
                    (&i64::try_from(limit).unwrap_or(i64::MAX), Type::INT8),
                ],
            )
            .await
            .map_err(postgres_error)
    }

    /// Entries by state.
    pub async fn outbox_counts(&self) -> Result<OutboxCounts> {
        let s = &self.schema;
        let client = self.pool.get().await.map_err(pool_error)?;
        let rows = client
            .query_typed(
                &format!("SELECT state, count(*) FROM {s}.outbox GROUP BY state"),
                &[],
            )
            .await
            .map_err(postgres_error)?;
        let mut counts = OutboxCounts::default();
        for row in rows {
            let n = row.get::<_, i64>(1) as u64;
            match row.get::<_, &str>(0) {
                "pending" => counts.pending = n,
                "delivered" => counts.delivered = n,
                _ => counts.dead = n,
            }
        }
        Ok(counts)
    }
}
