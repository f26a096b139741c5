//! Palisade's sample job handlers and the embedded demo. The `palisade` binary is
//! [`palisade::cli::App`] over [`registry`] plus the `demo` subcommand (`src/main.rs`).
//!
//! # Layout
//! - this file: the job kinds (`ledger.deposit`, `email.send`) and [`registry`].
//! - `demo`: the embedded demo (`palisade demo`), `report` its picture.
//!
//! The chaos soak is a crate of its own (`soak/`, never shipped), so this binary carries no
//! soak, no test-only job kind and no planted-bug switch.

use std::time::Duration;

use palisade::{JobContext, JobError, Mutation, NewJob, Registry};
use serde::{Deserialize, Serialize};

pub mod demo;
pub mod report;

/// Kind name of [`deposit`].
pub const DEPOSIT: &str = "ledger.deposit";
/// Kind name of [`send_email`].
pub const SEND_EMAIL: &str = "email.send";
/// Name of the fenced sink the ledger writes to.
pub const LEDGER: &str = "ledger";

/// Adds `cents` to one account's balance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Deposit {
    /// Account number; the job's scope is `account:{account}`.
    pub account: u32,
    /// Amount, may be negative.
    pub cents: i64,
    /// Fail the first this-many attempts before writing (a flaky upstream), to exercise retries.
    #[serde(default)]
    pub fail_first_attempts: u32,
    /// Send the write twice under one idempotency key (a client retry after a lost reply).
    #[serde(default)]
    pub resend_write: bool,
    /// Work this long before writing (without watching for cancellation, like code between a
    /// read and a write): lets tests pause or kill a worker while it holds the job.
    #[serde(default)]
    pub hold_ms: u64,
}

impl Deposit {
    /// The enqueueable job: scoped to the account, so deposits to one account run one at a
    /// time and are fenced per account.
    pub fn job(&self) -> NewJob {
        NewJob::new(DEPOSIT, self)
            .expect("a Deposit always encodes")
            .with_scope(account_key(self.account))
            .with_max_attempts(self.fail_first_attempts + 3)
    }
}

/// Sink key (and scope) of an account.
pub fn account_key(account: u32) -> String {
    format!("account:{account}")
}

/// `ledger.deposit`: one fenced `HashIncr` of the account's balance.
pub async fn deposit(ctx: JobContext, d: Deposit) -> Result<(), JobError> {
    if ctx.job().attempt <= d.fail_first_attempts {
        return Err(JobError::retry("upstream ledger API timed out"));
    }
    if d.hold_ms > 0 {
        tokio::time::sleep(Duration::from_millis(d.hold_ms)).await;
    }
    let ledger = ctx.sink(LEDGER)?;
    let credit = vec![Mutation::HashIncr {
        key: account_key(d.account),
        field: "balance".into(),
        by: d.cents,
    }];
    // Keyed by job, not by run: a re-run after a stall cannot credit twice.
    let key = palisade::IdempotencyKey::new(format!("{}/credit", ctx.job().id));
    ledger
        .write_keyed(key.clone(), credit.clone())
        .await?
        .accepted()?;
    if d.resend_write {
        // The resend is a Duplicate: same scope, token and key.
        ledger.write_keyed(key, credit).await?.accepted()?;
    }
    Ok(())
}

/// Sends a (pretend) email.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Email {
    /// Recipient.
    pub to: String,
    /// Pretend delivery time.
    pub millis: u64,
}

/// `email.send`: an unfenced side job that only takes time.
pub async fn send_email(ctx: JobContext, e: Email) -> Result<(), JobError> {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(e.millis)) => Ok(()),
        _ = ctx.cancellation().cancelled() => Err(JobError::retry(format!("lease lost while mailing {}", e.to))),
    }
}

/// Every job kind of this crate.
pub fn registry() -> Registry {
    Registry::new()
        .register(DEPOSIT, deposit)
        .register(SEND_EMAIL, send_email)
}
