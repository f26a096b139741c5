//! Identities and encodings two releases must compute alike, pinned to literal values.
//!
//! During a rolling deploy the previous release and this one run side by side against one
//! Redis and one Postgres: a default scope, a step's job id or a schedule tick's unique key
//! that one of them computes differently is a second lease on one resource, a step run twice,
//! a tick fired twice. So each is pinned here to the value the released code computes. The
//! UUIDv5 values were computed apart from this code (Python's `uuid.uuid5` over the same
//! namespace and name), not copied from its output.
//!
//! A failure here is a format change: never update a literal to make it pass. Keep the old
//! identity (add a new one beside it if it must change) and say so in CHANGELOG.md. The
//! identities minted outside this crate are pinned beside their code: completion follow-ups
//! and default write keys in palisade's `context.rs`, relay jobs in its `relay.rs`, token
//! padding in palisade-redis' `fenced.rs`, API idempotency keys in palisade-cli's
//! `api/model.rs`.

use std::time::Duration;

use palisade_core::flow::step_job_id;
use palisade_core::ids::{FencingToken, FlowId, JobId, Scope};
use palisade_core::job::NewJob;
use palisade_core::schedule::Schedule;
use uuid::uuid;

fn job() -> JobId {
    JobId::from(uuid!("00000000-0000-4000-8000-000000000001"))
}

#[test]
fn a_default_scope_is_job_colon_id() {
    assert_eq!(
        Scope::of_job(job()).as_str(),
        "job:00000000-0000-4000-8000-000000000001"
    );
    assert_eq!(Scope::of_job(job()).job(), Some(job()));
}

#[test]
fn a_step_job_id_is_uuid5_of_flow_and_step_name() {
    let flow = FlowId::from(uuid!("00000000-0000-4000-8000-000000000001"));
    assert_eq!(
        step_job_id(flow, "charge").to_string(),
        "13cdbe5e-9dd7-5ec9-8bb6-54252a47eb0d"
    );
}

#[test]
fn a_token_is_epoch_shifted_40_bits_or_counter() {
    let token = FencingToken::new(5, 7);
    assert_eq!(token.as_u64(), 5_497_558_138_887);
    assert_eq!(FencingToken::COUNTER_BITS, 40);
    assert_eq!(FencingToken::MAX_EPOCH, (1 << 23) - 1);
    let read = FencingToken::from_u64(5_497_558_138_887);
    assert_eq!((read.epoch(), read.counter()), (5, 7));
    // Stored and sent as a plain JSON number.
    assert_eq!(serde_json::to_string(&token).unwrap(), "5497558138887");
    // The highest token fits Postgres' signed BIGINT.
    let highest = FencingToken::new(FencingToken::MAX_EPOCH, FencingToken::MAX_COUNTER);
    assert_eq!(highest.as_u64(), i64::MAX as u64);
}

#[test]
fn a_producer_chosen_id_holds_the_unique_key_id_colon_id() {
    let new = NewJob::raw("k", "{}").with_id(job());
    assert_eq!(
        new.unique.unwrap().key,
        "id:00000000-0000-4000-8000-000000000001"
    );
}

#[test]
fn a_schedule_tick_holds_the_unique_key_schedule_name_tick() {
    let schedule = Schedule::new("nightly", "0 3 * * *", NewJob::raw("report", "{}")).unwrap();
    let job = schedule.job_for(1_764_903_600_000);
    assert_eq!(
        job.unique.as_ref().unwrap().key,
        "schedule:nightly:1764903600000"
    );
    let tick = job.tick.unwrap();
    assert_eq!(
        (tick.schedule.as_str(), tick.at_ms),
        ("nightly", 1_764_903_600_000)
    );
}

/// A job as the coordinators keep it in records a previous release reads back (follow-up
/// sets, flow steps): field names and the encoding of each.
#[test]
fn a_new_job_encodes_as_the_previous_release_reads_it() {
    // (5 was the default attempts when this was written; 0.2 made it 20. The encoding is
    // what is pinned, so the job says its count.)
    let new = NewJob::raw("invoice.send", r#"{"order":7}"#)
        .with_max_attempts(5)
        .with_queue("mail")
        .with_scope("customer:9")
        .with_unique_key("u", Duration::from_secs(60));
    assert_eq!(serde_json::to_string(&new).unwrap(), GOLDEN_NEW_JOB);
    // And the other way: what the previous release wrote, plus a field it may grow later,
    // reads back into the same job (an unknown field is not an error).
    let grown = GOLDEN_NEW_JOB.replacen('{', r#"{"a_field_from_a_later_release":1,"#, 1);
    assert_eq!(serde_json::from_str::<NewJob>(&grown).unwrap(), new);
}

/// As the code of commit 85f51c3 (before any change of issue 55) wrote it.
const GOLDEN_NEW_JOB: &str = concat!(
    r#"{"queue":"mail","kind":"invoice.send","payload":"{\"order\":7}","scope":"customer:9","#,
    r#""priority":0,"delay":{"secs":0,"nanos":0},"max_attempts":5,"max_stalls":3,"#,
    r#""unique":{"key":"u","ttl":{"secs":60,"nanos":0}},"max_snoozes":100}"#
);
