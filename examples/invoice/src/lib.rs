//! Settling an invoice, the way a user's crate would: the `UPDATE` of the user's own
//! `invoice` row and the receipt for the customer are one fenced transaction on the Postgres
//! sink `billing`. A worker that paused past its lease (GC, SIGSTOP, a suspended VM) and wakes
//! up after another worker settled the invoice is refused before its SQL runs: the invoice is
//! settled once, and the receipt is recorded — and so sent — once.

use std::time::Duration;

use palisade::{JobContext, JobError, Registry};
use serde::{Deserialize, Serialize};

/// The Postgres sink handlers write to (`--sink billing=postgres://…`).
pub const BILLING: &str = "billing";
/// The outbox target receipts go to (`--target email=https://…`).
pub const EMAIL: &str = "email";
/// Job kind.
pub const SETTLE: &str = "invoice.settle";

/// `invoice.settle` payload.
#[derive(Debug, Serialize, Deserialize)]
pub struct Settle {
    /// Row id in `invoice`.
    pub invoice: i64,
    /// Time spent before settling (talking to a payment provider, say), in ms.
    #[serde(default)]
    pub hold_ms: u64,
}

/// What the receipt says; also the transaction's recorded result.
#[derive(Debug, Serialize, Deserialize)]
pub struct Receipt {
    /// Invoice settled.
    pub invoice: i64,
    /// Amount, in cents.
    pub total_cents: i64,
}

/// The user's table (created by `invoice setup`).
pub const SCHEMA_SQL: &str = "CREATE TABLE IF NOT EXISTS invoice (
    id bigint PRIMARY KEY,
    total_cents bigint NOT NULL,
    paid_at timestamptz,
    paid_by_token bigint
)";

/// Settles one invoice: fenced by the job's lease, keyed `settle` within the job.
pub async fn settle(ctx: JobContext, job: Settle) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(job.hold_ms)).await;
    let token = ctx.lease().token.as_u64() as i64;
    let settled = ctx
        .postgres(BILLING)?
        .transaction("settle", move |tx| {
            Box::pin(async move {
                // The user's own SQL. It runs only if this lease still owns the invoice's
                // scope, after the fence row is locked: no other holder can be in between.
                let row = tx
                    .query_opt(
                        "UPDATE invoice SET paid_at = now(), paid_by_token = $2 \
                         WHERE id = $1 AND paid_at IS NULL RETURNING total_cents",
                        &[&job.invoice, &token],
                    )
                    .await?;
                let Some(row) = row else {
                    return Ok(None); // already paid: nothing to send
                };
                let receipt = Receipt {
                    invoice: job.invoice,
                    total_cents: row.get(0),
                };
                // Recorded in the same transaction: no commit, no receipt.
                tx.outbox(EMAIL).push("receipt", &receipt).await?;
                Ok(Some(receipt))
            })
        })
        .await?;
    // Applied or Duplicate (a re-run of this job): done. Rejected: a newer holder owns it.
    settled.accepted().map(drop).map_err(JobError::from)
}

/// The example's jobs.
pub fn registry() -> Registry {
    Registry::new().register(SETTLE, settle)
}
