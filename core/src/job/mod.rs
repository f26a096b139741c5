//! What users enqueue, what a claim hands back, what a handler returns, and the views read
//! back, one file by role: `new` (a producer's [`NewJob`], the limits, [`Enqueued`]), `claimed`
//! ([`Job`], [`Claim`]), `outcome` ([`JobError`], [`Settlement`], [`FollowUps`]) and `views`
//! ([`QueueCounts`], [`DeadJob`], [`JobView`]). Flows name jobs and jobs name flows only through
//! `claimed` and `outcome`, so `flow` builds on `new` alone.

mod claimed;
mod new;
mod outcome;
mod views;

pub use claimed::{Claim, Job};
pub use new::{batch_fingerprint, check_name, conflict, validate_batch};
#[doc(hidden)] // for the drivers and the runtime
pub use new::{check_cap, default_max_snoozes, is_default_max_snoozes, whole_ms};
pub use new::{
    Cancelled, Debounce, Enqueued, NewJob, RateLimit, Tick, UniqueKey, DEBOUNCE_KEPT,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_SNOOZES, ENQUEUE_RETRY_FOR,
    ENQUEUE_RETRY_WINDOW, ID_RETENTION, JOURNAL_CLEAR_KIND, MAX_DELAY, MAX_FOLLOW_UPS,
    MAX_FOLLOW_UP_BYTES, MAX_NAME_BYTES, MAX_TICK_MS, PRIORITY_RANGE, RESULT_RETENTION,
};
#[doc(hidden)] // the Redis store's record of a completion's follow-ups
pub use outcome::FollowUpRecord;
pub use outcome::{FollowUps, JobError, Settlement, Then};
pub use views::{
    clip_error, Attempt, AttemptOutcome, CompletedJob, CompletedRetention, DeadAction, DeadFilter,
    DeadJob, DeadSweep, JobDetails, JobState, JobView, QueueCounts, MAX_ATTEMPTS_KEPT,
    MAX_ATTEMPT_ERROR_BYTES, MAX_COMPLETED_KEPT,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{JobId, Scope};
    use std::time::Duration;

    /// A fingerprint is stored with a job and compared by the next release during a rolling
    /// deploy: pinned. It covers what the job asks for (payload, queue, priority, delay...) and
    /// not its id, unique key or trace, which a retried request may carry differently.
    #[test]
    fn fingerprints_are_pinned_and_cover_what_a_job_asks_for() {
        let job = NewJob::raw("mail", r#"{"to":"a@x"}"#);
        // = "v1:" + sha256(json.dumps({"queue":"default","kind":"mail","payload":
        // "{\"to\":\"a@x\"}","scope":None,"priority":0,"delay_ms":0,"max_attempts":20,
        // "max_stalls":3,"max_snoozes":100,"timeout_ms":None,"deadline_ms":None,"group":None,
        // "tick":None}, separators=(",",":"))).hexdigest()[:32], in Python.
        assert_eq!(job.fingerprint(), "v1:9e8c3fd0a6e10e6e50f28837286be381");
        let same = job
            .clone()
            .with_id(JobId::new())
            .with_unique_key("k", Duration::from_secs(1));
        assert_eq!(same.fingerprint(), job.fingerprint());
        let changed = [
            NewJob::raw("mail", r#"{"to":"b@x"}"#),
            job.clone().with_queue("other"),
            job.clone().with_priority(1),
            job.clone().with_delay(Duration::from_millis(1)),
            job.clone().with_max_attempts(3),
            job.clone().with_scope("s"),
            job.clone().with_group("g"),
        ];
        for other in changed {
            assert_ne!(other.fingerprint(), job.fingerprint(), "{other:?}");
        }
        let one = job.fingerprint();
        assert_ne!(
            batch_fingerprint([one.as_str(), one.as_str()]),
            batch_fingerprint([one.as_str()])
        );
        // A job's own id key carries the job's; a plain key none; a debounced job none.
        let id = JobId::new();
        assert_eq!(
            job.clone().with_id(id).key_fingerprint(),
            Some(job.fingerprint())
        );
        let plain = job.clone().with_unique_key("k", Duration::from_secs(1));
        assert_eq!(plain.key_fingerprint(), None);
        let debounced = job.clone().with_id(id).with_debounce(
            "d",
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        assert_eq!(debounced.key_fingerprint(), None);
    }

    /// The printable-ASCII fast path ends where it must: every byte from ' ' to '~' passes,
    /// and each ASCII control character (DEL included, just past '~') is still refused.
    #[test]
    fn names_pass_on_printable_ascii_and_control_characters_are_refused() {
        let printable: String = (b' '..=b'~').map(char::from).collect();
        assert!(check_name("queue", &printable).is_ok());
        for b in (0u8..b' ').chain([0x7f]) {
            let name = format!("a{}b", char::from(b));
            let err = check_name("queue", &name).unwrap_err().to_string();
            assert!(err.contains("control character"), "{b:#x}: {err}");
        }
        assert!(check_name("queue", "naïve-größe-東京").is_ok());
    }

    /// A right-to-left override (or any other invisible format character) in a queue, kind,
    /// scope or unique key is refused: "invoice\u{202E}fdp." would show as another name.
    #[test]
    fn names_with_invisible_format_characters_are_refused() {
        for c in [
            '\u{202E}',
            '\u{200B}',
            '\u{2066}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{E0041}',
        ] {
            let name = format!("invoice{c}pdf");
            let err = check_name("queue", &name).unwrap_err().to_string();
            assert!(err.contains("invisible format character"), "{err}");
            let job = |f: fn(NewJob, &str) -> NewJob| f(NewJob::raw("k", "{}"), &name);
            for bad in [
                job(|j, n| j.with_queue(n)),
                job(|j, n| NewJob {
                    kind: n.into(),
                    ..j
                }),
                job(|j, n| j.with_scope(Scope::new(n))),
                job(|j, n| j.with_unique_key(n, Duration::from_secs(1))),
            ] {
                assert!(bad.validate(DEFAULT_MAX_PAYLOAD_BYTES).is_err(), "{bad:?}");
            }
        }
        // A tick's schedule is a name, and its instant one every record keeps exactly.
        let ticked = |schedule: &str, at_ms: i64| {
            let mut job = NewJob::raw("k", "{}");
            job.tick = Some(Tick {
                schedule: schedule.into(),
                at_ms,
            });
            job.validate(DEFAULT_MAX_PAYLOAD_BYTES)
        };
        ticked("nightly", 1_790_000_000_000).unwrap();
        for (schedule, at_ms) in [
            ("", 0),
            ("a\u{202E}b", 0),
            ("n", -1),
            ("n", MAX_TICK_MS),
            ("n", i64::MAX),
        ] {
            assert!(ticked(schedule, at_ms).is_err(), "{schedule:?} {at_ms}");
        }
        // Letters of every script, and emoji, stay names.
        for ok in ["файлы", "请求", "émission", "queue📦", "حساب"] {
            check_name("queue", ok).unwrap();
        }
    }

    /// The kept follow-up record reads back as written, in both shapes: jobs alone as the
    /// array (the record of releases without flows), jobs and flows as the object.
    #[test]
    fn follow_up_records_read_back_in_both_shapes() {
        let parent = JobId::new();
        let jobs = vec![NewJob::raw("child", "1").with_id(JobId::new())];
        let flows = vec![crate::flow::Flow::new().step("a", NewJob::raw("k", "null"))];
        assert_eq!(FollowUpRecord::encode(&[], &[]).unwrap(), "");
        let alone = FollowUpRecord::encode(&jobs, &[]).unwrap();
        assert!(alone.starts_with('['), "{alone}");
        let both = FollowUpRecord::encode(&jobs, &flows).unwrap();
        for (json, flows) in [(alone, Vec::new()), (both, flows)] {
            assert_eq!(
                FollowUpRecord::decode(parent, &json).unwrap(),
                FollowUps {
                    parent,
                    jobs: jobs.clone(),
                    flows,
                }
            );
        }
    }

    /// Issue 55: what a reader does with a record it may not fully understand. A field it
    /// does not know in a version-1 record is skipped (version 1 promises nothing else); a
    /// record of a later version, or of a shape it cannot read, is refused whole, so that the
    /// caller leaves it for a process that reads it instead of delivering half of it.
    #[test]
    fn a_follow_up_record_of_a_later_format_is_refused_whole() {
        let parent = JobId::new();
        let job = NewJob::raw("child", "1").with_id(JobId::new());
        let jobs = serde_json::to_string(&[&job]).unwrap();
        // A version-1 object without flows (the jobs-only shape is the array, but a writer
        // may send the object): read, flows empty.
        let set = FollowUpRecord::decode(parent, &format!(r#"{{"jobs":{jobs},"note":1}}"#));
        assert_eq!(set.unwrap().jobs, std::slice::from_ref(&job));
        let set = FollowUpRecord::decode(parent, &format!(r#"{{"v":1,"jobs":{jobs}}}"#));
        assert_eq!(set.unwrap().jobs, [job]);
        for unreadable in [
            format!(r#"{{"v":2,"jobs":{jobs},"waits":[]}}"#),
            r#"{"v":2,"waits":[]}"#.to_owned(),
            "not json".to_owned(),
            r#"{"jobs":"nope"}"#.to_owned(),
        ] {
            let why = FollowUpRecord::decode(parent, &unreadable).unwrap_err();
            assert!(!why.is_empty(), "{unreadable}");
        }
        let why = FollowUpRecord::decode(parent, r#"{"v":2,"jobs":[]}"#).unwrap_err();
        assert!(why.contains("format version 2"), "{why}");
        assert_eq!(FollowUpRecord::decode(parent, "").unwrap().jobs, []);
    }
}
