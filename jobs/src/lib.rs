//! Palisade's sample job handlers and the embedded demo. The `palisade` binary is
//! [`palisade_cli::App`] over [`registry`] plus the `demo` subcommand (`src/main.rs`).
//!
//! # Layout
//! - this file: the job kinds (`ledger.deposit`, `email.send`, and the fan-in flow's
//!   `report.split`, `report.part`, `report.total`, `report.announce`) and [`registry`].
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

/// Kind name of [`report_part`].
pub const REPORT_PART: &str = "report.part";
/// Kind name of [`report_total`].
pub const REPORT_TOTAL: &str = "report.total";
/// Kind name of [`report_announce`].
pub const REPORT_ANNOUNCE: &str = "report.announce";
/// Kind name of [`report_split`].
pub const REPORT_SPLIT: &str = "report.split";

/// What `report.split` splits: `parts` parts, each working `hold_ms`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Split {
    /// How many parts (numbered 1..=parts).
    pub parts: i64,
    /// Each part's work time.
    #[serde(default)]
    pub hold_ms: u64,
}

/// `report.split`'s result: the steps it added, for the step after it to add up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Added {
    /// Their names in the flow.
    pub steps: Vec<String>,
}

/// One part of a report: a number to add up, after some work.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Part {
    /// The part's number.
    pub n: i64,
    /// Work this long first (lets tests pause or kill a worker while it holds parts).
    #[serde(default)]
    pub hold_ms: u64,
}

/// A report flow: `parts` parts (`part:1` … `part:N`, numbered 1..=N), a `total` step after
/// all of them that adds their results up and writes the total through the ledger, and the
/// batch's `on_complete` callback `report.announce`, which counts itself in the ledger once.
pub fn report_flow(parts: i64, hold_ms: u64) -> palisade::Flow {
    let mut flow = palisade::Flow::new();
    let mut names = Vec::new();
    for n in 1..=parts {
        let part = NewJob::new(REPORT_PART, &Part { n, hold_ms })
            .expect("a Part always encodes")
            .with_max_attempts(5);
        flow = flow.step(format!("part:{n}"), part);
        names.push(format!("part:{n}"));
    }
    let after: Vec<&str> = names.iter().map(String::as_str).collect();
    with_total(flow, &after)
}

/// Adds a report's `total` step after `after` and its `on_complete` callback. Both write the
/// report's ledger key under the report's scope (a Redis Cluster keeps a fence and the data
/// it guards in one slot: the key's hash tag is the scope).
fn with_total(flow: palisade::Flow, after: &[&str]) -> palisade::Flow {
    let scope = report_scope(flow.id());
    flow.step_after(
        "total",
        NewJob::new(REPORT_TOTAL, &())
            .expect("unit encodes")
            .with_scope(scope.clone()),
        after,
    )
    .on_complete(
        NewJob::new(REPORT_ANNOUNCE, &())
            .expect("unit encodes")
            .with_scope(scope),
    )
}

/// The same report, fanned out by a handler: a `split` step whose handler adds the parts to
/// the flow when it completes ([`report_split`]), so `total` — and the `on_complete`
/// callback — wait for parts the flow did not name when it was created.
pub fn report_fanout_flow(parts: i64, hold_ms: u64) -> palisade::Flow {
    let flow = palisade::Flow::new().step(
        "split",
        NewJob::new(REPORT_SPLIT, &Split { parts, hold_ms }).expect("a Split always encodes"),
    );
    with_total(flow, &["split"])
}

/// `report.split`: adds its parts to its flow (`part:1` … `part:N`, each after nothing but
/// this step), fenced with its completion, and returns their names.
pub async fn report_split(ctx: JobContext, s: Split) -> Result<Added, JobError> {
    let mut steps = Vec::new();
    for n in 1..=s.parts {
        let part = NewJob::new(
            REPORT_PART,
            &Part {
                n,
                hold_ms: s.hold_ms,
            },
        )?
        .with_max_attempts(5);
        ctx.add_step(&format!("part:{n}"), part, [])?;
        let me = &ctx.job().flow.as_ref().expect("add_step checked").step;
        steps.push(palisade::added_step_name(me, &format!("part:{n}")));
    }
    Ok(Added { steps })
}

/// The scope of a report flow's `total` and `report.announce` steps.
pub fn report_scope(flow: palisade::FlowId) -> String {
    format!("report:{flow}")
}

/// Ledger key of a report flow's total and announcement count: its scope as a hash tag.
pub fn report_key(flow: palisade::FlowId) -> String {
    format!("{{{}}}", report_scope(flow))
}

/// `report.part`: returns its number (after `hold_ms`, unless its lease is lost first).
pub async fn report_part(ctx: JobContext, p: Part) -> Result<i64, JobError> {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(p.hold_ms)) => Ok(p.n),
        _ = ctx.cancellation().cancelled() => Err(JobError::retry(format!("lease lost on part {}", p.n))),
    }
}

/// `report.total`: adds up the results of the steps it runs after — for a `report.split`
/// step, those of the steps it added — writes the total through the ledger (fenced, keyed
/// by job: a re-run cannot write twice), and returns it.
pub async fn report_total(ctx: JobContext, _: ()) -> Result<i64, JobError> {
    let step = ctx
        .job()
        .flow
        .clone()
        .ok_or_else(|| JobError::fatal("report.total runs only as a flow step"))?;
    let mut parts = Vec::new();
    for dep in &step.after {
        let value: serde_json::Value = ctx
            .dependency(dep)
            .await?
            .ok_or_else(|| JobError::fatal(format!("{dep} kept no result")))?;
        match serde_json::from_value::<Added>(value.clone()) {
            Ok(added) => parts.extend(added.steps),
            Err(_) => parts.push(dep.clone()),
        }
    }
    let mut total = 0i64;
    for part in &parts {
        let n: i64 = ctx
            .dependency(part)
            .await?
            .ok_or_else(|| JobError::fatal(format!("{part} kept no result")))?;
        total += n;
    }
    let key = palisade::IdempotencyKey::new(format!("{}/total", ctx.job().id));
    ctx.sink(LEDGER)?
        .write_keyed(
            key,
            vec![Mutation::HashSet {
                key: report_key(step.flow),
                fields: vec![("total".into(), total.to_string())],
            }],
        )
        .await?
        .accepted()?;
    Ok(total)
}

/// `report.announce`: the report flow's callback — counts itself once in the ledger (keyed by
/// job: a callback run again after a stall adds nothing).
pub async fn report_announce(ctx: JobContext, _: ()) -> Result<(), JobError> {
    let step = ctx
        .job()
        .flow
        .clone()
        .ok_or_else(|| JobError::fatal("report.announce runs only as a flow step"))?;
    let key = palisade::IdempotencyKey::new(format!("{}/announce", ctx.job().id));
    ctx.sink(LEDGER)?
        .write_keyed(
            key,
            vec![Mutation::HashIncr {
                key: report_key(step.flow),
                field: "announced".into(),
                by: 1,
            }],
        )
        .await?
        .accepted()?;
    Ok(())
}

/// Every job kind of this crate.
pub fn registry() -> Registry {
    Registry::new()
        .register(DEPOSIT, deposit)
        .register(SEND_EMAIL, send_email)
        .register_with_result(REPORT_PART, report_part)
        .register_with_result(REPORT_TOTAL, report_total)
        .register(REPORT_ANNOUNCE, report_announce)
        .register_with_result(REPORT_SPLIT, report_split)
        .with_example(DEPOSIT, r#"{"account":42,"cents":250}"#)
        .with_example(SEND_EMAIL, r#"{"to":"ops@example.com","millis":10}"#)
        .with_example(REPORT_PART, r#"{"n":1}"#)
        .with_example(REPORT_TOTAL, "null")
        .with_example(REPORT_ANNOUNCE, "null")
        .with_example(REPORT_SPLIT, r#"{"parts":3}"#)
}
