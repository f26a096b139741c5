//! A user's own jobs, in their own crate: one kind (`stock.reserve`) writing to one fenced
//! sink of their own (`inventory`). Nothing here is Palisade's sample code.

use std::time::Duration;

use palisade::{JobContext, JobError, Mutation, Registry};
use serde::Deserialize;

/// The fenced sink the handlers write to.
pub const INVENTORY: &str = "inventory";

/// Reserves `qty` units of a SKU. Enqueue it scoped to the SKU (`--scope 'sku:{sku}'`), so
/// reservations of one SKU run one at a time and are fenced per SKU.
#[derive(Debug, Deserialize)]
pub struct Reserve {
    /// Stock keeping unit.
    pub sku: u32,
    /// Units to reserve (negative releases).
    pub qty: i64,
    /// Pretend to call a slow warehouse API this long before writing.
    #[serde(default)]
    pub hold_ms: u64,
}

/// `stock.reserve`: one fenced increment of the SKU's reserved count.
pub async fn reserve(ctx: JobContext, r: Reserve) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(r.hold_ms)).await;
    ctx.sink(INVENTORY)?
        .write(vec![Mutation::HashIncr {
            key: format!("stock:{}", r.sku),
            field: "reserved".into(),
            by: r.qty,
        }])
        .await?
        .accepted()?;
    Ok(())
}

/// Every job kind of this crate.
pub fn registry() -> Registry {
    Registry::new().register("stock.reserve", reserve)
}
