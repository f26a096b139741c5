//! A user's job: a payment applied to an account through a fenced sink, and a receipt asked
//! for with its completion.

use palisade::{JobContext, JobError, Mutation, NewJob, Registry};
use serde::{Deserialize, Serialize};

/// A payment of `cents` into `account`.
#[derive(Serialize, Deserialize)]
pub struct Pay {
    pub account: u32,
    pub cents: i64,
}

async fn pay(ctx: JobContext, p: Pay) -> Result<(), JobError> {
    ctx.sink("ledger")?
        .write(vec![Mutation::HashIncr {
            key: format!("account:{}", p.account),
            field: "cents".into(),
            by: p.cents,
        }])
        .await?
        .accepted()?;
    ctx.follow_up(NewJob::new("receipt", &p.account)?.with_queue("mail"))?;
    Ok(())
}

async fn receipt(_: JobContext, _account: u32) -> Result<(), JobError> {
    Ok(())
}

/// The crate's kinds.
pub fn registry() -> Registry {
    Registry::new()
        .register("pay", pay)
        .register("receipt", receipt)
}
