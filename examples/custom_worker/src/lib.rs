//! A user's own jobs, in their own crate: three kinds (`stock.reserve`, `order.place`,
//! `order.remind`) writing to one fenced sink of their own (`inventory`). Nothing here is
//! Palisade's sample code. Their unit tests (tests/jobs.rs) use only `palisade::testing`.

use std::time::Duration;

use palisade::{IdempotencyKey, JobContext, JobError, Mutation, NewJob, Registry};
use serde::{Deserialize, Serialize};

/// The fenced sink the handlers write to.
pub const INVENTORY: &str = "inventory";

/// Reserves `qty` units of a SKU. Enqueue it scoped to the SKU (`--scope 'sku:{sku}'`), so
/// reservations of one SKU run one at a time and are fenced per SKU.
#[derive(Debug, Serialize, Deserialize)]
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

/// The queue reminders wait in.
pub const MAIL: &str = "mail";

/// How long after an order its reminder goes out.
pub const REMIND_AFTER: Duration = Duration::from_secs(3600);

/// An order of `qty` units of one SKU. Enqueue it scoped to the SKU, like a reservation.
#[derive(Debug, Serialize, Deserialize)]
pub struct Order {
    /// The order's number: placing it twice reserves once.
    pub order: u64,
    /// Stock keeping unit.
    pub sku: u32,
    /// Units.
    pub qty: i64,
}

/// A reminder about an order.
#[derive(Debug, Serialize, Deserialize)]
pub struct Remind {
    /// The order.
    pub order: u64,
    /// How many tries the mail server turns away before it takes one (a flaky server).
    #[serde(default)]
    pub bounces: u32,
}

/// `order.place`: reserves the order's units and marks it reserved, in one fenced write
/// keyed by the order (so two jobs for one order reserve once), then asks for a reminder an
/// hour later, which is enqueued with the completion.
pub async fn place(ctx: JobContext, o: Order) -> Result<(), JobError> {
    ctx.sink(INVENTORY)?
        .write_keyed(
            IdempotencyKey::new(format!("order:{}", o.order)),
            vec![
                Mutation::HashIncr {
                    key: format!("stock:{}", o.sku),
                    field: "reserved".into(),
                    by: o.qty,
                },
                Mutation::HashSet {
                    key: format!("order:{}", o.order),
                    fields: vec![("status".into(), "reserved".into())],
                },
            ],
        )
        .await?
        .accepted()?;
    let remind = Remind {
        order: o.order,
        bounces: 0,
    };
    ctx.follow_up(
        NewJob::new("order.remind", &remind)?
            .with_queue(MAIL)
            .with_delay(REMIND_AFTER),
    )?;
    Ok(())
}

/// `order.remind`: sends the reminder (a retry while the mail server turns it away), then
/// marks the order reminded.
pub async fn remind(ctx: JobContext, r: Remind) -> Result<(), JobError> {
    if ctx.job().attempt <= r.bounces {
        return Err(JobError::retry("mail server busy"));
    }
    ctx.sink(INVENTORY)?
        .write(vec![Mutation::HashSet {
            key: format!("order:{}", r.order),
            fields: vec![("reminded".into(), "yes".into())],
        }])
        .await?
        .accepted()?;
    Ok(())
}

/// Every job kind of this crate.
pub fn registry() -> Registry {
    Registry::new()
        .register("stock.reserve", reserve)
        .register("order.place", place)
        .register("order.remind", remind)
}
