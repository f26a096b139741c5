//! An order saga as one durable run, the way a user's crate would write it: each step's effect
//! and its journal entry are one fenced write, so a worker that paused mid-step (GC, SIGSTOP,
//! a suspended VM) and wakes after another worker took the run over is refused on both.
//!
//! 1. **reserve** one unit of stock (the Redis sink `ledger`);
//! 2. **charge** the order in the user's own `charge` table, with its receipt in the outbox
//!    (one fenced transaction on the Postgres sink `payments`);
//! 3. over 500 EUR, **wait** for a manager's approval (`approval:order-<id>`, completed over
//!    HTTP, the CLI or the console): refused, or not given within a day, the charge is
//!    **refunded** and the stock **released**, and the run ends;
//! 4. **cool off** (a durable sleep: the worker's slot is free meanwhile);
//! 5. **ship**.

use std::time::Duration;

use palisade::durable::Waited;
use palisade::{JobContext, JobError, Mutation, Registry};
use serde::{Deserialize, Serialize};

/// The Redis (or memory) sink for stock and shipping, and the run's journal.
pub const LEDGER: &str = "ledger";
/// The Postgres sink for charges and refunds (`--sink payments=postgres://…`).
pub const PAYMENTS: &str = "payments";
/// The outbox target receipts go to (`--target receipts=https://…`).
pub const RECEIPTS: &str = "receipts";
/// Job kind.
pub const SAGA: &str = "order.saga";
/// Orders over this many cents wait for approval.
pub const APPROVAL_OVER_CENTS: i64 = 50_000;

/// `order.saga` payload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Order {
    /// The order's id (its scope is `order:<id>`).
    pub id: i64,
    /// Its total, in cents.
    pub cents: i64,
    /// Time the warehouse takes to reserve (ms).
    #[serde(default)]
    pub reserve_ms: u64,
    /// The cool-off before shipping (ms; ten minutes unless given).
    #[serde(default = "default_cool_off")]
    pub cool_off_ms: u64,
    /// How long to wait for approval (ms; a day unless given).
    #[serde(default = "default_approval_within")]
    pub approval_within_ms: u64,
}

fn default_cool_off() -> u64 {
    600_000
}

fn default_approval_within() -> u64 {
    86_400_000
}

/// The user's tables (created by `saga setup`): one row per charge and per refund, each
/// with the token of the claim that wrote it.
pub const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS charge (order_id bigint NOT NULL, cents bigint NOT NULL, token bigint NOT NULL);
CREATE TABLE IF NOT EXISTS refund (order_id bigint NOT NULL, cents bigint NOT NULL, token bigint NOT NULL);
";

/// The approval's waitpoint id for order `id`.
pub fn approval(id: i64) -> String {
    format!("approval:order-{id}")
}

/// A key of order `id` in the ledger, in its scope's hash tag (a Redis Cluster keeps a
/// write's keys in its scope's slot).
fn key(id: i64, what: &str) -> String {
    format!("{{order:{id}}}:{what}")
}

/// How the saga ended.
#[derive(Debug, Serialize, Deserialize)]
pub enum Ended {
    /// Shipped, with the charge's receipt number.
    Shipped(String),
    /// Refunded: approval refused or never given.
    Refunded,
}

/// The saga.
pub async fn saga(ctx: JobContext, order: Order) -> Result<Ended, JobError> {
    let run = ctx.durable(LEDGER)?;
    let pg = ctx.postgres(PAYMENTS)?;
    let id = order.id;
    run.step("reserve", || async {
        // Talking to the warehouse: a worker may pause here.
        tokio::time::sleep(Duration::from_millis(order.reserve_ms)).await;
        let held = Mutation::HashIncr {
            key: key(id, "stock"),
            field: "held".into(),
            by: 1,
        };
        Ok((vec![held], ()))
    })
    .await?;
    let token = ctx.lease().token.as_u64() as i64;
    let cents = order.cents;
    let receipt: String = run
        .pg_step("charge", &pg, move |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO charge (order_id, cents, token) VALUES ($1, $2, $3)",
                    &[&id, &cents, &token],
                )
                .await?;
                let receipt = format!("R-{id}-{token}");
                tx.outbox(RECEIPTS).push("receipt", &receipt).await?;
                Ok(receipt)
            })
        })
        .await?;
    if order.cents > APPROVAL_OVER_CENTS {
        let within = Duration::from_millis(order.approval_within_ms);
        let approved = run
            .wait_for::<bool>("approval", &approval(id), within)
            .await?;
        if approved != Waited::Completed(true) {
            // Compensation: each is a step, so it happens once however often the run resumes.
            run.pg_step("refund", &pg, move |tx| {
                Box::pin(async move {
                    tx.execute(
                        "INSERT INTO refund (order_id, cents, token) VALUES ($1, $2, $3)",
                        &[&id, &cents, &token],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await?;
            run.step("release", || async {
                let released = Mutation::HashIncr {
                    key: key(id, "stock"),
                    field: "held".into(),
                    by: -1,
                };
                Ok((vec![released], ()))
            })
            .await?;
            return Ok(Ended::Refunded);
        }
    }
    run.sleep("cool-off", Duration::from_millis(order.cool_off_ms))
        .await?;
    run.step("ship", || async {
        let shipped = Mutation::Set {
            key: key(id, "shipped"),
            value: receipt.clone(),
        };
        Ok((vec![shipped], ()))
    })
    .await?;
    Ok(Ended::Shipped(receipt))
}

/// The example's jobs.
pub fn registry() -> Registry {
    Registry::new()
        .register_with_result(SAGA, saga)
        .with_example(SAGA, r#"{"id": 1, "cents": 90000}"#)
}
